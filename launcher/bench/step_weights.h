// The weights of each step of the update bench, written in place as a trainer's conversion would
// write them.
#pragma once

#include <cstddef>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"
#include "sync/trainer/tensor_arena.h"
#include "sync/trainer/tensors.h"

namespace weightcast::launcher {

// The weights of each step: the generator's step k (jump) or realistic drift from step 0. They
// live in a TensorArena, written in place each step as a trainer's conversion would write them,
// so buckets go out without a pack pass. With `digest_at_write` each tensor is hashed right after
// it is written, while it is in the cache, and its view carries the digest (NamedTensor::digest),
// as weightcast-train's stage does; that time is kept apart from the update's.
class StepWeights {
 public:
  // `shared`: the arena is a memfd segment the colocated path sends from as it is.
  StepWeights(const std::vector<sync::TensorMeta>& metas, bool realistic, double lr,
              bool digest_at_write, bool shared = false);
  // Moves to `step`; returns the fraction of elements that changed (1 for jumps).
  double advance(int step);
  std::vector<sync::trainer::NamedTensor> views() const;
  const sync::trainer::TensorArena& storage() const { return storage_; }
  // The last advance()'s hashing, summed over tensors (0 without digest_at_write).
  double digest_seconds() const { return digest_seconds_; }

 private:
  void digest(std::size_t i);

  const std::vector<sync::TensorMeta>& metas_;
  sync::trainer::TensorArena storage_;
  std::vector<sync::Drift> drifts_;
  std::vector<sync::Digest> digests_;  // one per tensor with digest_at_write, else empty
  double digest_seconds_ = 0;
};

}  // namespace weightcast::launcher

// ReceiverBase: the host copy of the last committed tensors that a Receiver keeps while delta
// updates are on, and the digests of what each of its runners last loaded.
//
// A real engine holds its weights sharded, fused or quantized, so it cannot hand back the
// full-precision bytes a delta bucket (sync/model/delta.h) is computed against. The receiver
// therefore keeps, per tensor name, the raw bytes it last committed: the staged views themselves
// (pool blocks, no copy), so the memory is one copy of the tensors sent, reported by bytes().
// Without deltas only the per-runner digests are kept (a few dozen bytes per tensor), which
// /weights_checksum-style readers and the trainer's delta decision use.
// Lifetime: owned by one Receiver. Threading: not synchronized; the Receiver holds its lock
// (fill() runs on the group's unpack thread while no commit can run).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "sync/engine/stage/block_pool.h"
#include "sync/engine/stage/ordered_insert.h"
#include "sync/model/bucket.h"
#include "sync/model/checksum.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::engine {

class ReceiverBase {
 public:
  explicit ReceiverBase(bool keep_bytes) : keep_bytes_(keep_bytes) {}

  // Deltas on or off: off drops every kept byte at once (the digests stay).
  void set_keep_bytes(bool keep);
  bool keeps_bytes() const { return keep_bytes_; }

  // Records a tensor runner `runner` now holds: its digest, and (deltas on) its raw bytes.
  void record(Runner runner, const TensorMeta& meta, const SharedBytes& bytes,
              const Digest& digest);
  // Records a commit's tensors, given in increasing name order (as a std::map iterates them):
  // each lookup starts where the previous one ended, instead of at the root. Returns the bytes.
  template <typename Range, typename Fields>
  std::size_t record_in_order(Runner runner, const Range& tensors, Fields fields);

  // Bytes held for delta bases (0 with deltas off).
  std::size_t bytes() const { return bytes_; }
  // Whether a delta may be applied: deltas on and something committed.
  bool has_base() const { return keep_bytes_ && !base_.empty(); }
  struct Tensor {
    TensorMeta meta;
    SharedBytes bytes;
  };
  // The tensor last committed under `name`, if kept.
  const Tensor* base_of(std::string_view name) const;

  // Writes the base of `plan` into `bucket`, checked against the trainer's `expected` digests;
  // a refusal message naming the first tensor not held or not matching. Entries without a
  // destination are zero-filled and unchecked (their bytes are dropped anyway).
  std::optional<std::string> fill(const BucketPlan& plan,
                                  const std::vector<std::vector<Runner>>& destinations,
                                  const std::vector<Digest>& expected,
                                  std::span<std::byte> bucket) const;

  // Name -> digest of what `runner` holds (name order).
  const std::map<std::string, Digest>& digests(Runner runner) const;
  // One digest over the runners `selector` covers; empty when no base is kept (the trainer then
  // never sends a delta).
  std::string held_digest(Selector selector) const;

 private:
  bool keep_bytes_;
  std::map<std::string, Tensor, std::less<>> base_;
  std::map<std::string, Digest> digests_[2];
  std::size_t bytes_ = 0;
};

// `fields(entry)` gives (meta, bytes, digest) of one element of `tensors`.
template <typename Range, typename Fields>
std::size_t ReceiverBase::record_in_order(Runner runner, const Range& tensors, Fields fields) {
  auto& digests = digests_[static_cast<int>(runner)];
  auto next_digest = digests.begin();
  auto next_base = base_.begin();
  std::size_t total = 0;
  for (const auto& entry : tensors) {
    const auto& [meta, bytes, digest] = fields(entry);
    total += bytes.size();
    auto d = place_in_order(digests, next_digest, meta.name);
    d->second = digest;
    next_digest = std::next(d);
    if (!keep_bytes_) continue;
    auto b = place_in_order(base_, next_base, meta.name);
    bytes_ -= b->second.bytes.size();
    b->second.meta = meta;
    b->second.bytes = bytes;
    bytes_ += bytes.size();
    next_base = std::next(b);
  }
  return total;
}

}  // namespace weightcast::sync::engine

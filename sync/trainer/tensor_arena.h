// TensorArena: host memory for a model's tensors, laid out as weightcast buckets carry them.
//
// Each tensor starts at the next multiple of the bucket alignment after the one before it, the
// rule the bucket planner (sync/model/bucket.h) applies inside a bucket. So whichever tensors of
// the list a bucket holds, in the list's order, they already lie at the bucket's offsets from its
// first tensor: the sender sends the bucket from the arena in place (in_place(), packer.h)
// instead of copying it into a pack buffer, and same-host engines read it with huge-page copies.
// Writing a step's weights into an arena (generating, converting or gathering them) replaces the
// pack pass. The memory is one huge-page mapping, zeroed, so alignment padding reads as zeros.
// Lifetime: the views stay valid while the arena lives; moving the arena keeps them valid.
// Threading: distinct tensors may be written concurrently; the arena itself is immutable.
#pragma once

#include <optional>

#include "comm/colocate/segment.h"

#include <cstddef>
#include <span>
#include <vector>

#include "sync/model/bucket.h"
#include "sync/protocol/tensor.h"
#include "sync/trainer/packer.h"

namespace weightcast::sync::trainer {

class TensorArena {
 public:
  TensorArena() = default;
  // Lays out `metas` in order. `alignment`: a power of two, the buckets' (kDefaultBucketAlignment
  // for weightcast buckets; in_place() fails, harmlessly, for any other). `shared`: the memory is
  // a sealed memfd segment (comm/colocate/segment.h) instead of huge pages, so the colocated path
  // hands it to same-host engines as it is (comm::colocate::find_shared) instead of copying each
  // bucket into a segment of its own.
  explicit TensorArena(std::span<const TensorMeta> metas,
                       std::size_t alignment = kDefaultBucketAlignment, bool shared = false);

  std::size_t size() const { return views_.size(); }
  // Tensor i's bytes (metas[i].byte_count() long).
  std::span<std::byte> operator[](std::size_t i) const;
  // Every byte of the arena, padding included.
  std::size_t total_bytes() const { return bytes_; }

 private:
  PackBuffer memory_;                                     // huge pages, freed as pack buffers are
  std::optional<comm::colocate::SharedSegment> segment_;  // instead, when shared
  std::size_t bytes_ = 0;
  std::vector<std::span<std::byte>> views_;
};

}  // namespace weightcast::sync::trainer

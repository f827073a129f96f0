// The tensors a trainer hands to the updater: a name, dtype and shape (sync::TensorMeta) with
// host bytes (and optionally their digest), either borrowed (NamedTensor, what update() takes, so a
// trainer never copies its weights to call it) or owned (HostTensor, what the converters produce).
// A NamedTensor may also be a slice of another tensor read in place (SliceView: shard-aware
// broadcast, docs/sharding.md): its bytes are then empty, and tensor_bytes_of()/write_tensor()/
// digest_of() read the slice from the full tensor run by run.
// Lifetime: a NamedTensor borrows; its bytes (and a view's full tensor) must outlive the call it
// is passed to.
// Threading: plain values.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/model/shard_plan.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::trainer {

// `slice` of the full tensor `full_meta` whose bytes are `full`.
struct SliceView {
  TensorMeta full_meta;
  TensorSlice slice;
  std::span<const std::byte> full;
};

struct NamedTensor {
  TensorMeta meta;
  std::span<const std::byte> bytes;  // exactly meta.byte_count() long
  // Optional: XXH3-128 of `bytes` (tensor_digest()), made by whoever wrote them, e.g. while
  // they were still in the cache. Borrowed like `bytes` and read when they are read (after
  // BucketSendOptions::await_tensor), so a producer may fill it in while earlier buckets go out.
  // The sender then carries it instead of hashing the bytes again. A digest that does not match
  // the bytes sent makes every engine refuse the bucket: the update fails, nothing is committed.
  // Null: the sender hashes the bytes.
  const Digest* digest = nullptr;
  // Set: the tensor is this slice of another, read in place; `bytes` is empty. Borrowed.
  const SliceView* view = nullptr;
};

// The tensor's byte count (a view's: its slice's).
inline std::size_t tensor_size(const NamedTensor& t) {
  return t.view != nullptr ? t.meta.byte_count() : t.bytes.size();
}
// Writes the tensor's bytes into `out` (exactly tensor_size() long, else EnforceError): a
// memcpy, or a view's slice run by run (pack_slice).
void write_tensor(const NamedTensor& t, std::span<std::byte> out);
// XXH3-128 of the tensor's bytes: its producer's digest if it has one, else computed (a view's
// from its runs, without a copy).
Digest digest_of(const NamedTensor& t);

struct HostTensor {
  TensorMeta meta;
  std::vector<std::byte> bytes;

  NamedTensor view() const { return NamedTensor{meta, bytes}; }
};

// Views of `tensors`, in order.
inline std::vector<NamedTensor> views(const std::vector<HostTensor>& tensors) {
  std::vector<NamedTensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.view());
  return out;
}

}  // namespace weightcast::sync::trainer

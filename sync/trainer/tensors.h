// The tensors a trainer hands to the updater: a name, dtype and shape (sync::TensorMeta) with
// host bytes (and optionally their digest), either borrowed (NamedTensor, what update() takes, so a
// trainer never copies its weights to call it) or owned (HostTensor, what the converters produce).
// Lifetime: a NamedTensor borrows; its bytes must outlive the call it is passed to.
// Threading: plain values.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::trainer {

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
};

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

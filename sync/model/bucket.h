// Buckets: how a model's tensors are packed into flat buffers, one collective per bucket.
//
// The source and every engine must agree on where each tensor sits in a bucket without sending
// offsets, so offsets are a pure function of the tensor list and the alignment:
//   - tensors keep the given order; each non-empty tensor starts at the next multiple of
//     `alignment` (default 256 bytes, so a device kernel can read a tensor in place; CUDA
//     allocations are 256-byte aligned too), the gap is padding and counts in total_bytes;
//   - a zero-byte tensor sits at the bucket's current end without padding (there is nothing to
//     read) and never opens a bucket: it joins the current one (the first tensor opens bucket
//     0 whatever its size), so only a model of zero-byte tensors has a zero-byte bucket;
//   - total_bytes is the end of the last tensor (no trailing padding).
// plan_buckets() splits greedily: a tensor that would end past max_bucket_bytes closes the
// current bucket, unless that bucket holds no bytes yet; so a tensor larger than
// max_bucket_bytes gets a bucket of its own (shared only with zero-byte tensors). Atomic groups
// (sync/model/atomic_groups.h) are never cut: a group that would end past max_bucket_bytes closes
// the current bucket and opens the next, and a group larger than max_bucket_bytes on its own is a
// comm::ConfigError naming it and its size. An engine that
// receives one bucket's tensor list rebuilds the same plan with make_bucket().
// pack() writes a bucket into a buffer (padding zeroed, so bucket bytes are deterministic);
// unpack() gives each tensor's bytes inside a received buffer, without copying.
// Lifetime/threading: plans are plain values; the functions are pure apart from writing the
// buffer passed to pack(); safe from any thread on disjoint buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sync/model/atomic_groups.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

inline constexpr std::size_t kDefaultBucketAlignment = 256;

struct BucketEntry {
  TensorMeta meta;
  std::size_t offset = 0;  // from the start of the bucket
  std::size_t bytes = 0;   // meta.byte_count()

  bool operator==(const BucketEntry&) const = default;
};

struct BucketPlan {
  std::uint64_t sequence = 0;  // 0, 1, 2, ... in plan order
  std::vector<BucketEntry> entries;
  std::size_t total_bytes = 0;

  bool operator==(const BucketPlan&) const = default;
};

// Splits `metas` into buckets as described above, keeping each of `groups` (atomic_groups() of
// `metas`: sorted, disjoint, within the list, else EnforceError) in one bucket. An empty list
// gives no buckets. max_bucket_bytes > 0 and alignment a power of two (EnforceError otherwise); a
// byte count or offset that overflows throws comm::BadRequestError naming the tensor.
std::vector<BucketPlan> plan_buckets(const std::vector<TensorMeta>& metas,
                                     std::size_t max_bucket_bytes,
                                     std::size_t alignment = kDefaultBucketAlignment,
                                     std::span<const AtomicGroup> groups = {});

// One bucket holding all of `metas`, with the offsets plan_buckets() would give them.
BucketPlan make_bucket(std::uint64_t sequence, std::vector<TensorMeta> metas,
                       std::size_t alignment = kDefaultBucketAlignment);

// The largest total_bytes of `plans` (0 for none): the size of a staging buffer.
std::size_t max_total_bytes(const std::vector<BucketPlan>& plans);

// Returns the bytes of the tensor of `entry` (exactly entry.bytes long, else EnforceError).
using TensorSource = std::function<std::span<const std::byte>(const BucketEntry& entry)>;

// Writes the tensor of `entry` into `out` (exactly entry.bytes long): for tensors that are not
// one span of bytes (a slice read in place from its full tensor).
using TensorWriter = std::function<void(const BucketEntry& entry, std::span<std::byte> out)>;

// Fills `out` (exactly plan.total_bytes long, else EnforceError) with the plan's tensors at
// their offsets and zero padding. pack_with() has each tensor written by `write`.
void pack(const BucketPlan& plan, const TensorSource& source, std::span<std::byte> out);
void pack_with(const BucketPlan& plan, const TensorWriter& write, std::span<std::byte> out);

struct TensorBytes {
  const BucketEntry* entry;  // points into the plan passed to unpack()
  std::span<const std::byte> bytes;
};

// Each entry's bytes inside `buffer` (exactly plan.total_bytes long, else EnforceError), in
// plan order. The spans alias `buffer`; the entries alias `plan`.
std::vector<TensorBytes> unpack(std::span<const std::byte> buffer, const BucketPlan& plan);

}  // namespace weightcast::sync

// Shard plans: what each engine rank keeps of each full HF tensor, so that a rank can be sent
// only its slice (docs/sharding.md).
//
// A tensor-parallel engine narrows every full tensor it loads: rank r of a TP-n engine keeps rows
// [r*k, (r+1)*k) of a column-parallel weight, columns of a row-parallel one, its heads of q/k/v,
// its vocabulary block of embed_tokens and lm_head, and a whole copy of a replicated tensor (norms,
// routers). With expert parallelism it keeps only the experts its EP rank holds. A ShardPlan
// writes that down per HF tensor as one TensorSlice:
//   - a slice: `length` indices of dimension `dim` from `offset` (torch's narrow(dim, offset,
//     length)); the fused parameters an engine builds (q/k/v into qkv_proj, gate/up into
//     gate_up_proj) are described from the HF side, one slice per HF tensor;
//   - replicated: the whole tensor;
//   - absent: nothing (an expert another EP rank holds).
// Ranks whose plans are equal hold equal bytes of every tensor, whatever engine they belong to:
// class_key() names that class, and a sender can broadcast each class's bytes once, to the ranks
// of that class only.
//
// JSON (what an engine announces): {"tensors": {"<hf name>": {"dim": 0, "offset": 128,
// "length": 128} | "replicated" | "absent", ...}}.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sync/model/checksum.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

struct TensorSlice {
  enum class Kind { kSlice, kReplicated, kAbsent };
  Kind kind = Kind::kReplicated;
  int dim = 0;              // kSlice only
  std::int64_t offset = 0;  // kSlice only
  std::int64_t length = 0;  // kSlice only

  static TensorSlice slice(int dim, std::int64_t offset, std::int64_t length) {
    return {Kind::kSlice, dim, offset, length};
  }
  static TensorSlice replicated() { return {}; }
  static TensorSlice absent() { return {Kind::kAbsent, 0, 0, 0}; }

  bool operator==(const TensorSlice&) const = default;
};

// "dim 0 [128, 256)", "replicated", "absent".
std::string describe(const TensorSlice& slice);

// One engine rank's plan: HF tensor name -> what the rank keeps of it.
struct ShardPlan {
  std::map<std::string, TensorSlice, std::less<>> tensors;

  // The entry for `name`, or nullptr when the plan does not name it.
  const TensorSlice* find(std::string_view name) const;
  // A stable 16-hex-digit key of the plan's content: ranks with equal plans (and only those, up
  // to a 64-bit hash collision) have equal keys.
  std::string class_key() const;

  bool operator==(const ShardPlan&) const = default;
};

nlohmann::json to_json(const ShardPlan& plan);
// Throws comm::BadRequestError naming the tensor and field for anything but the JSON above: an
// entry that is neither an object nor "replicated"/"absent", a missing or non-integer dim, offset
// or length, a negative offset, a length < 1, or an invalid tensor name.
ShardPlan shard_plan_from_json(const nlohmann::json& json);

// Checks the plans of one engine's ranks (rank i's at index i) against the full tensors it
// receives. Throws comm::BadRequestError naming the tensor (and the rank) unless:
//   - every rank's plan names every tensor, and no other;
//   - a slice lies inside the tensor: 0 <= dim < rank of the shape, offset + length <= that
//     dimension's size;
//   - per tensor, the ranks that keep anything keep it the same way: all replicated, or all
//     slices of one dimension, and two slices are equal (ranks replicating a group of heads)
//     or disjoint;
//   - per tensor, the ranks together keep all of it: some rank is not absent, and the slices
//     cover the dimension without a gap.
void validate_shard_plans(std::span<const TensorMeta> tensors, std::span<const ShardPlan> ranks);

// The shape and byte count of `meta` narrowed by `slice` (absent: 0 bytes, shape unchanged).
std::vector<std::int64_t> sliced_shape(const TensorMeta& meta, const TensorSlice& slice);
std::size_t sliced_bytes(const TensorMeta& meta, const TensorSlice& slice);

// Copies `slice` of the full tensor `full` (meta.byte_count() bytes) into `out`
// (sliced_bytes() bytes) in row-major order: what torch's narrow(dim, offset, length)
// .contiguous() holds. A strided copy, one memcpy per run of contiguous bytes, no temporary.
// unpack_slice() is its inverse: it writes a slice's bytes into their place in a full tensor.
// Sizes that do not match throw comm::EnforceError with both values.
void pack_slice(const TensorMeta& meta, const TensorSlice& slice, std::span<const std::byte> full,
                std::span<std::byte> out);
// tensor_digest() of what pack_slice() would write, read run by run from `full` (no copy).
Digest slice_digest(const TensorMeta& meta, const TensorSlice& slice,
                    std::span<const std::byte> full);
void unpack_slice(const TensorMeta& meta, const TensorSlice& slice, std::span<const std::byte> part,
                  std::span<std::byte> full);

}  // namespace weightcast::sync

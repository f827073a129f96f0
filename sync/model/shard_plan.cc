#include "sync/model/shard_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "comm/errors.h"
#include "sync/protocol/dtype.h"

namespace weightcast::sync {
namespace {

using comm::BadRequestError;

std::string tensor_field(std::string_view name) {
  return "shard plan: tensor '" + std::string(name) + "'";
}

std::int64_t integer_field(const nlohmann::json& entry, const char* key, std::string_view name) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_number_integer()) {
    throw BadRequestError(tensor_field(name) + ": '" + key + "' must be an integer");
  }
  return it->get<std::int64_t>();
}

TensorSlice slice_from_json(const nlohmann::json& entry, std::string_view name) {
  if (entry.is_string()) {
    const auto text = entry.get<std::string>();
    if (text == "replicated") return TensorSlice::replicated();
    if (text == "absent") return TensorSlice::absent();
    throw BadRequestError(tensor_field(name) + ": '" + text +
                          "' is not a slice; expected \"replicated\", \"absent\" or "
                          "{\"dim\", \"offset\", \"length\"}");
  }
  if (!entry.is_object()) {
    throw BadRequestError(tensor_field(name) +
                          ": expected \"replicated\", \"absent\" or {\"dim\", \"offset\", "
                          "\"length\"}, got " +
                          std::string(entry.type_name()));
  }
  const std::int64_t dim = integer_field(entry, "dim", name);
  const std::int64_t offset = integer_field(entry, "offset", name);
  const std::int64_t length = integer_field(entry, "length", name);
  if (dim < 0 || dim > 64) {
    throw BadRequestError(tensor_field(name) + ": dim " + std::to_string(dim) +
                          " is not a dimension");
  }
  if (offset < 0) {
    throw BadRequestError(tensor_field(name) + ": offset must be >= 0 (got " +
                          std::to_string(offset) + ")");
  }
  if (length < 1) {
    throw BadRequestError(tensor_field(name) + ": length must be >= 1 (got " +
                          std::to_string(length) + ")");
  }
  return TensorSlice::slice(static_cast<int>(dim), offset, length);
}

// Rows of contiguous bytes of a slice: `outer` runs of `run` bytes, the full tensor's run o
// starting at (o * dim_size + offset) * inner bytes.
struct SliceRuns {
  std::size_t outer = 1;
  std::size_t run = 0;        // bytes per run in the slice
  std::size_t full_step = 0;  // bytes between runs in the full tensor
  std::size_t first = 0;      // byte offset of the first run in the full tensor
};

SliceRuns runs_of(const TensorMeta& meta, const TensorSlice& slice) {
  std::size_t inner = element_size(meta.dtype);
  for (std::size_t d = static_cast<std::size_t>(slice.dim) + 1; d < meta.shape.size(); ++d) {
    inner *= static_cast<std::size_t>(meta.shape[d]);
  }
  SliceRuns r;
  for (int d = 0; d < slice.dim; ++d) r.outer *= static_cast<std::size_t>(meta.shape[d]);
  const auto dim_size = static_cast<std::size_t>(meta.shape[slice.dim]);
  r.run = static_cast<std::size_t>(slice.length) * inner;
  r.full_step = dim_size * inner;
  r.first = static_cast<std::size_t>(slice.offset) * inner;
  return r;
}

void check_inside(const TensorMeta& meta, const TensorSlice& slice, std::size_t rank) {
  if (slice.kind != TensorSlice::Kind::kSlice) return;
  const std::string where = tensor_field(meta.name) + " (rank " + std::to_string(rank) + ")";
  if (static_cast<std::size_t>(slice.dim) >= meta.shape.size()) {
    throw BadRequestError(where + ": dim " + std::to_string(slice.dim) + " of a tensor of rank " +
                          std::to_string(meta.shape.size()));
  }
  const std::int64_t size = meta.shape[static_cast<std::size_t>(slice.dim)];
  if (slice.offset + slice.length > size) {
    throw BadRequestError(where + ": " + describe(slice) + " is outside dim " +
                          std::to_string(slice.dim) + " of size " + std::to_string(size));
  }
}

// The same check for a caller's own slice: misuse, not bad input.
void enforce_inside(const TensorMeta& meta, const TensorSlice& slice) {
  WC_ENFORCE_LT(static_cast<std::size_t>(slice.dim), meta.shape.size(), meta.name);
  WC_ENFORCE_LE(slice.offset + slice.length, meta.shape[static_cast<std::size_t>(slice.dim)],
                meta.name);
}

// Per tensor across ranks: one way of keeping it, slices equal or disjoint, and full coverage.
void check_tensor_across_ranks(const TensorMeta& meta, std::span<const ShardPlan> ranks) {
  std::set<std::pair<std::int64_t, std::int64_t>> intervals;  // distinct [offset, end)
  int dim = -1;
  bool replicated = false;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const TensorSlice& s = *ranks[r].find(meta.name);
    if (s.kind == TensorSlice::Kind::kReplicated) replicated = true;
    if (s.kind != TensorSlice::Kind::kSlice) continue;
    if (dim >= 0 && s.dim != dim) {
      throw BadRequestError(tensor_field(meta.name) + ": rank " + std::to_string(r) +
                            " slices dim " + std::to_string(s.dim) + ", an earlier rank dim " +
                            std::to_string(dim));
    }
    dim = s.dim;
    intervals.emplace(s.offset, s.offset + s.length);
  }
  if (replicated && dim >= 0) {
    throw BadRequestError(tensor_field(meta.name) +
                          ": some ranks replicate it and others slice it");
  }
  if (!replicated && dim < 0) {
    throw BadRequestError(tensor_field(meta.name) + ": no rank keeps it (absent on every rank)");
  }
  if (dim < 0) return;
  std::int64_t covered = 0;
  for (const auto& [begin, end] : intervals) {
    if (begin < covered) {
      throw BadRequestError(tensor_field(meta.name) + ": slices overlap at dim " +
                            std::to_string(dim) + " index " + std::to_string(begin) +
                            " (slices must be equal or disjoint)");
    }
    if (begin > covered) {
      throw BadRequestError(tensor_field(meta.name) + ": dim " + std::to_string(dim) + " [" +
                            std::to_string(covered) + ", " + std::to_string(begin) +
                            ") is kept by no rank");
    }
    covered = end;
  }
  const std::int64_t size = meta.shape[static_cast<std::size_t>(dim)];
  if (covered != size) {
    throw BadRequestError(tensor_field(meta.name) + ": dim " + std::to_string(dim) + " [" +
                          std::to_string(covered) + ", " + std::to_string(size) +
                          ") is kept by no rank");
  }
}

}  // namespace

std::string describe(const TensorSlice& slice) {
  switch (slice.kind) {
    case TensorSlice::Kind::kReplicated:
      return "replicated";
    case TensorSlice::Kind::kAbsent:
      return "absent";
    case TensorSlice::Kind::kSlice:
      break;
  }
  return "dim " + std::to_string(slice.dim) + " [" + std::to_string(slice.offset) + ", " +
         std::to_string(slice.offset + slice.length) + ")";
}

const TensorSlice* ShardPlan::find(std::string_view name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

std::string ShardPlan::class_key() const {
  XXH3_state_t* state = XXH3_createState();
  WC_ENFORCE(state != nullptr, "out of memory");
  XXH3_64bits_reset(state);
  for (const auto& [name, s] : tensors) {
    const std::string line = name + '\t' + describe(s) + '\n';
    XXH3_64bits_update(state, line.data(), line.size());
  }
  const XXH64_hash_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

nlohmann::json to_json(const ShardPlan& plan) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, s] : plan.tensors) {
    switch (s.kind) {
      case TensorSlice::Kind::kReplicated:
        tensors[name] = "replicated";
        break;
      case TensorSlice::Kind::kAbsent:
        tensors[name] = "absent";
        break;
      case TensorSlice::Kind::kSlice:
        tensors[name] = {{"dim", s.dim}, {"offset", s.offset}, {"length", s.length}};
        break;
    }
  }
  return {{"tensors", std::move(tensors)}};
}

ShardPlan shard_plan_from_json(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("tensors") || !json["tensors"].is_object()) {
    throw BadRequestError("shard plan: expected an object with an object 'tensors'");
  }
  ShardPlan plan;
  for (const auto& [name, entry] : json["tensors"].items()) {
    validate_tensor_name(name, "shard plan tensor name");
    plan.tensors.emplace(name, slice_from_json(entry, name));
  }
  return plan;
}

void validate_shard_plans(std::span<const TensorMeta> tensors, std::span<const ShardPlan> ranks) {
  if (ranks.empty()) throw BadRequestError("shard plan: an engine with no ranks");
  std::set<std::string_view> names;
  for (const auto& meta : tensors) names.insert(meta.name);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& [name, slice] : ranks[r].tensors) {
      if (!names.contains(name)) {
        throw BadRequestError(tensor_field(name) + " (rank " + std::to_string(r) +
                              "): not a tensor of the model");
      }
    }
    for (const auto& meta : tensors) {
      const TensorSlice* s = ranks[r].find(meta.name);
      if (s == nullptr) {
        throw BadRequestError(tensor_field(meta.name) + ": rank " + std::to_string(r) +
                              "'s plan does not cover it");
      }
      check_inside(meta, *s, r);
    }
  }
  for (const auto& meta : tensors) check_tensor_across_ranks(meta, ranks);
}

std::vector<std::int64_t> sliced_shape(const TensorMeta& meta, const TensorSlice& slice) {
  std::vector<std::int64_t> shape = meta.shape;
  if (slice.kind == TensorSlice::Kind::kSlice) {
    WC_ENFORCE_LT(static_cast<std::size_t>(slice.dim), shape.size(), meta.name);
    shape[static_cast<std::size_t>(slice.dim)] = slice.length;
  }
  return shape;
}

std::size_t sliced_bytes(const TensorMeta& meta, const TensorSlice& slice) {
  if (slice.kind == TensorSlice::Kind::kAbsent) return 0;
  const TensorMeta narrowed{meta.name, meta.dtype, sliced_shape(meta, slice)};
  return narrowed.byte_count();
}

namespace {

// Checks the sizes, then calls fn(full_offset, part_offset, bytes) for each contiguous run of
// the slice: one run for a replicated tensor, none for an absent one.
template <typename Fn>
void for_each_run(const TensorMeta& meta, const TensorSlice& slice, std::size_t full_size,
                  std::size_t part_size, Fn&& fn) {
  WC_ENFORCE_EQ(full_size, meta.byte_count(), meta.name);
  WC_ENFORCE_EQ(part_size, sliced_bytes(meta, slice), meta.name);
  if (slice.kind != TensorSlice::Kind::kSlice) {
    if (part_size > 0) fn(0, 0, part_size);
    return;
  }
  enforce_inside(meta, slice);
  const SliceRuns r = runs_of(meta, slice);
  for (std::size_t o = 0; o < r.outer; ++o) fn(o * r.full_step + r.first, o * r.run, r.run);
}

}  // namespace

void pack_slice(const TensorMeta& meta, const TensorSlice& slice, std::span<const std::byte> full,
                std::span<std::byte> out) {
  for_each_run(meta, slice, full.size(), out.size(),
               [&](std::size_t at, std::size_t to, std::size_t n) {
                 std::memcpy(out.data() + to, full.data() + at, n);
               });
}

Digest slice_digest(const TensorMeta& meta, const TensorSlice& slice,
                    std::span<const std::byte> full) {
  Hasher hasher;
  for_each_run(
      meta, slice, full.size(), sliced_bytes(meta, slice),
      [&](std::size_t at, std::size_t, std::size_t n) { hasher.update(full.subspan(at, n)); });
  return hasher.digest();
}

void unpack_slice(const TensorMeta& meta, const TensorSlice& slice, std::span<const std::byte> part,
                  std::span<std::byte> full) {
  for_each_run(meta, slice, full.size(), part.size(),
               [&](std::size_t at, std::size_t from, std::size_t n) {
                 std::memcpy(full.data() + at, part.data() + from, n);
               });
}

}  // namespace weightcast::sync

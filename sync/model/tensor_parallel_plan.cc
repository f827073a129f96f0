#include "sync/model/tensor_parallel_plan.h"

#include <string>
#include <string_view>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

bool ends_with(std::string_view name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

// `parts` equal blocks of `size` indices along `dim`; this rank's is block `index`.
TensorSlice block(const TensorMeta& meta, int dim, std::int64_t parts, std::int64_t index) {
  const std::int64_t size = meta.shape.at(static_cast<std::size_t>(dim));
  if (parts < 1 || size % parts != 0) {
    throw comm::ConfigError("shard plan: tensor '" + meta.name + "' dim " + std::to_string(dim) +
                            " of size " + std::to_string(size) + " does not split into " +
                            std::to_string(parts) + " equal parts");
  }
  if (parts == 1) return TensorSlice::replicated();
  const std::int64_t k = size / parts;
  return TensorSlice::slice(dim, index * k, k);
}

// k_proj/v_proj: KV heads split over the ranks, or replicated per group of ranks.
TensorSlice kv_heads(const ModelSpec& spec, const TensorMeta& meta, const ParallelRank& r) {
  const std::int64_t kv = spec.num_key_value_heads;
  const std::int64_t n = r.tp_size;
  if (kv % n == 0) return block(meta, 0, n, r.tp_rank);
  if (n % kv != 0) {
    throw comm::ConfigError("shard plan: tensor '" + meta.name + "': " + std::to_string(kv) +
                            " KV heads over " + std::to_string(n) +
                            " ranks (one must divide the other)");
  }
  const std::int64_t head = r.tp_rank / (n / kv);
  const std::int64_t per_head = meta.shape.at(0) / kv;
  return TensorSlice::slice(0, head * per_head, per_head);
}

// A routed expert's tensor: absent unless this rank's EP rank holds the expert, then split over
// the TP ranks that EP rank spans.
TensorSlice expert(const ModelSpec& spec, const TensorMeta& meta, const ExpertRef& ref,
                   const ParallelRank& r) {
  const int ep_rank = ep_rank_of_tp_rank(r.tp_rank, r.tp_size, r.ep_size);
  const ExpertPlacement mine(static_cast<int>(spec.num_experts), r.ep_size, ep_rank, r.placement);
  if (!mine.holds(ref.expert)) return TensorSlice::absent();
  const int moe_tp = r.tp_size / r.ep_size;
  const int moe_rank = r.tp_rank % moe_tp;
  if (ends_with(meta.name, "down_proj.weight")) return block(meta, 1, moe_tp, moe_rank);
  if (meta.shape.size() >= 2) return block(meta, 0, moe_tp, moe_rank);
  return TensorSlice::replicated();
}

TensorSlice slice_of(const ModelSpec& spec, const TensorMeta& meta, const ParallelRank& r) {
  const std::string_view name = meta.name;
  const int n = r.tp_size;
  const int rank = r.tp_rank;
  if (name.starts_with(kDraftPrefix) || meta.shape.size() < 2) return TensorSlice::replicated();
  if (spec.is_moe()) {
    if (const auto ref = parse_expert(name)) return expert(spec, meta, *ref, r);
  }
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight") ||
      ends_with(name, "self_attn.q_proj.weight") || ends_with(name, "self_attn.q_b_proj.weight") ||
      ends_with(name, "self_attn.kv_b_proj.weight") || ends_with(name, "gate_proj.weight") ||
      ends_with(name, "up_proj.weight")) {
    return block(meta, 0, n, rank);
  }
  if (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.v_proj.weight")) {
    return kv_heads(spec, meta, r);
  }
  if (ends_with(name, "self_attn.o_proj.weight") || ends_with(name, "down_proj.weight")) {
    return block(meta, 1, n, rank);
  }
  return TensorSlice::replicated();  // norms, the router, q_a/kv_a projections, mtp.fc
}

}  // namespace

ShardPlan tensor_parallel_plan(const ModelSpec& spec, std::span<const TensorMeta> tensors,
                               const ParallelRank& rank) {
  WC_ENFORCE_GE(rank.tp_size, 1);
  WC_ENFORCE(rank.tp_rank >= 0 && rank.tp_rank < rank.tp_size, "tp_rank ", rank.tp_rank,
             " of tp_size ", rank.tp_size);
  ShardPlan plan;
  for (const auto& meta : tensors) plan.tensors.emplace(meta.name, slice_of(spec, meta, rank));
  return plan;
}

}  // namespace weightcast::sync

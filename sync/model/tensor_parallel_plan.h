// The shard plan of a tensor-parallel (and expert-parallel) engine that narrows its weights the
// way vLLM's and SGLang's model loaders do, and the torch reference engine with them
// (python/weightcast/reference/model.py), written out by hand from the model's shape.
//
// Rules for TP rank r of n (k = a dimension's size / n):
//   - embed_tokens and lm_head: vocabulary-parallel, dim 0 [r*k, (r+1)*k);
//   - q_proj: its heads, dim 0; k_proj/v_proj: its KV heads, dim 0, or, with fewer KV heads than
//     ranks, the one KV head its group of n / kv ranks shares (rank r keeps head r / (n / kv));
//   - gate_proj/up_proj (dense MLP and shared experts): column-parallel, dim 0; o_proj and
//     down_proj: row-parallel, dim 1;
//   - multi-head latent attention: q_b_proj and kv_b_proj by heads (dim 0), o_proj dim 1;
//     q_a_proj, kv_a_proj_with_mqa and their norms replicated;
//   - routed experts: held or absent by ExpertPlacement (ep_size EP ranks, each spanning
//     n / ep_size TP ranks); a held expert is split over those n / ep_size ranks as a dense MLP;
//   - everything else (norms, the router, the EAGLE draft under "draft.", rank-1 tensors):
//     replicated.
// Sizes that do not divide as these rules need throw comm::ConfigError naming the tensor.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <span>

#include "sync/model/expert_placement.h"
#include "sync/model/model.h"
#include "sync/model/shard_plan.h"

namespace weightcast::sync {

struct ParallelRank {
  int tp_size = 1;
  int tp_rank = 0;
  int ep_size = 1;  // MoE only; divides tp_size
  PlacementStrategy placement = PlacementStrategy::kLinear;
};

// The plan of rank `rank` for `tensors` (e.g. hf_tensors(spec) or draft_tensors(spec)).
ShardPlan tensor_parallel_plan(const ModelSpec& spec, std::span<const TensorMeta> tensors,
                               const ParallelRank& rank);

}  // namespace weightcast::sync

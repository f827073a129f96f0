// Megatron-style model parallel shards of a synthetic model, and the "raw" conversion back to HF
// tensors that a stage source runs before broadcasting.
//
// A trainer rank holds Megatron parameters: the attention's q/k/v projections fused into
// `linear_qkv`, the MLP's gate/up projections fused into `linear_fc1`, layers numbered locally
// within their pipeline stage. Tensor parallelism splits them as Megatron does:
//   - column-parallel (linear_qkv, linear_fc1, MTP eh_proj) and vocab-parallel (embedding,
//     output layer) weights along dim 0;
//   - row-parallel weights (linear_proj = o_proj, linear_fc2 = down_proj) along dim 1;
//   - norms replicated.
// The fused shard of TP rank r is the concatenation, along dim 0, of rank r's row slice of each
// part: linear_qkv = [q_r; k_r; v_r], linear_fc1 = [gate_r; up_r]. Megatron interleaves q/k/v per
// query group instead; both put exactly the same elements on each rank, and only the order of
// rows inside a shard differs, so the gather-and-split logic is the same. Every split dimension
// must be divisible by the TP size (no vocab padding): ConfigError otherwise.
// Pipeline stage s of P holds layers [s*L/P, (s+1)*L/P); the embedding sits on stage 0; the final
// norm, the LM head and the MTP module on the last stage.
// Mixtures of experts (Megatron-core MoE layers): the router `mlp.router.weight` (mlp.gate) and
// `pre_mlp_layernorm.weight` (post_attention_layernorm) are replicated; shared experts are an MLP
// under `mlp.shared_experts.` (linear_fc1 = [gate; up], linear_fc2 = down, `gate_weight` =
// Qwen's shared_expert_gate). Experts are split over EP ranks: EP rank p of EP holds experts
// [p*E/EP, (p+1)*E/EP), global index = ep_rank * (E/EP) + local index, under either layout:
//   - kLocalExperts (SequentialMLP): mlp.experts.local_experts.{j}.linear_fc1.weight / linear_fc2
//   - kGroupedGemm (TEGroupedMLP):   mlp.experts.linear_fc1.weight{j} / linear_fc2.weight{j}
// Each expert's own matrices are also split over TP as an MLP's are (expert TP = TP).
// Multi-head latent attention (Megatron-core MLA): linear_q_down_proj (q_a_proj) and
// linear_kv_down_proj (kv_a_proj_with_mqa) are replicated; linear_q_up_proj (q_b_proj) and
// linear_kv_up_proj (kv_b_proj) are column-parallel with their input norms (q_a_layernorm,
// kv_a_layernorm) as `layer_norm_weight`; the layer's input norm is `input_layernorm.weight`.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/model/model.h"
#include "sync/protocol/tensor.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

enum class TpSplit {
  kReplicated,  // every TP rank holds the whole tensor
  kDim0,        // column- and vocab-parallel: contiguous row blocks
  kDim1,        // row-parallel: column blocks of a 2-D weight
  kFusedDim0,   // parts each split along dim 0, shard = concatenation of the part slices
};

std::string_view to_string(TpSplit split);

enum class ExpertLayout {
  kLocalExperts,  // mlp.experts.local_experts.{j}.linear_fc{1,2}.weight
  kGroupedGemm,   // mlp.experts.linear_fc{1,2}.weight{j}
};
std::string_view to_string(ExpertLayout layout);
// "local" or "grouped"; ConfigError otherwise.
ExpertLayout parse_expert_layout(std::string_view text);

// How the experts of an MoE model are spread: `ep` ranks, each holding num_experts / ep.
struct ExpertParallel {
  int ep = 1;
  ExpertLayout layout = ExpertLayout::kLocalExperts;
};

struct MegatronParam {
  std::string name;  // Megatron name, layer index local to the stage (expert index local to EP)
  TpSplit split = TpSplit::kReplicated;
  std::vector<TensorMeta> parts;  // the HF tensors it holds, in order (one unless fused)
  int ep_rank = -1;  // an expert's: the EP rank that holds it; -1: every EP rank (dense)

  DType dtype() const { return parts.front().dtype; }
  // Shape of the full (unsharded) Megatron tensor; fused parts stack along dim 0.
  std::vector<std::int64_t> shape() const;
  std::size_t byte_count() const;
};

// Layers [first, end) of stage `stage` of `stages`. ConfigError unless 0 <= stage < stages and
// every stage gets at least one layer.
struct StageLayers {
  std::int64_t first = 0;
  std::int64_t end = 0;
};
StageLayers stage_layers(const ModelSpec& spec, int stage, int stages);

// The Megatron parameters of one pipeline stage, the experts of every EP rank included (each
// with its ep_rank), ordered by their first HF part in hf_tensors(spec) order, so converting them
// back yields the stage's HF tensors in that order. ConfigError for an HF name this conversion
// does not know, or an EP size that does not divide num_experts (or is > 1 for a dense model).
std::vector<MegatronParam> stage_params(const ModelSpec& spec, int stage, int stages,
                                        const ExpertParallel& experts = {});

// The HF tensors of one stage, in hf_tensors(spec) order.
std::vector<TensorMeta> stage_hf_tensors(const ModelSpec& spec, int stage, int stages);

// The HF names of the Megatron parameter `megatron` (a stage-local name as stage_params() gives
// it) held by EP rank `ep_rank` on stage `stage`: what a trainer's EP rank converts its own
// parameters with. ConfigError for a name that stage and EP rank do not hold.
std::vector<std::string> hf_names(const ModelSpec& spec, int stage, int stages,
                                  const ExpertParallel& experts, int ep_rank,
                                  std::string_view megatron);

// Throws ConfigError naming the tensor and the dimension when `tp` does not divide a split
// dimension of one of `params`.
void check_tp_divisible(const std::vector<MegatronParam>& params, int tp);

// Bytes TP rank `tp_rank` of `tp` holds for `param`.
std::size_t shard_bytes(const MegatronParam& param, int tp);

// Returns the full bytes of an HF tensor (exactly meta.byte_count() long).
using HfBytes = std::function<std::span<const std::byte>(const TensorMeta& meta)>;

// Appends TP rank `tp_rank`'s shard of `param` to `out`, cut from the full HF tensors.
void append_shard(const MegatronParam& param, int tp, int tp_rank, const HfBytes& hf,
                  std::vector<std::byte>& out);

// The raw conversion: the HF tensors of `param` reassembled from its `tp` shards (shards[r] is
// rank r's, exactly shard_bytes() long; for a replicated param only shards[0] is read).
std::vector<HostTensor> to_hf(const MegatronParam& param,
                              std::span<const std::span<const std::byte>> shards);
// The same into `out`, one destination per part, each exactly the part's bytes long (an
// allocate_hf() tensor's bytes, or a TensorArena's).
void write_hf(const MegatronParam& param, std::span<const std::span<const std::byte>> shards,
              std::span<const std::span<std::byte>> out);
// Each tensor's bytes, in order: the destinations of write_hf() and assemble_hf_into().
std::vector<std::span<std::byte>> bytes_of(std::vector<HostTensor>& tensors);
// The HF tensors of `params`, in order, with zeroed bytes of their size: what the *_into and
// write_hf functions fill.
std::vector<HostTensor> allocate_hf(std::span<const MegatronParam> params);

// Bytes the rank (tp_rank, ep_rank) contributes for `param` to its stage source's gather: a
// dense param comes from EP rank 0 only and a replicated one from TP rank 0 only (the other
// ranks hold the same bytes, and sending them would only grow the gather); an expert from the
// TP ranks of the EP rank that holds it.
std::size_t contributed_bytes(const MegatronParam& param, int tp, int tp_rank, int ep_rank);

// What the rank (tp_rank, ep_rank) contributes to its stage source's gather at training step
// `step`: its contributed_bytes() of each of `params`, back to back in order, cut from the
// generator's full HF tensors (fill_tensor with `seed`, `step`).
std::vector<std::byte> rank_shards(const std::vector<MegatronParam>& params, int tp, int tp_rank,
                                   std::uint64_t seed, std::uint64_t step, int ep_rank = 0);

// The source's side: the stage's HF tensors, in order, from blocks[tp_rank + tp * ep_rank] =
// rank_shards() of that rank (blocks.size() is a multiple of `tp`: TP times the EP ranks that
// hold experts). EnforceError when a block has the wrong size.
std::vector<HostTensor> assemble_hf(const std::vector<MegatronParam>& params,
                                    std::span<const std::span<const std::byte>> blocks, int tp);
// The same into `out`, one destination per HF tensor of `params` in order (bytes_of(
// allocate_hf(params)), or a TensorArena's views), so a source can fill its tensors part by part,
// in place, while it sends the earlier ones.
// With `digests` (one per tensor of `out`; empty: none), each tensor's tensor_digest() is made
// right after it is written, while it is in the cache, for NamedTensor::digest.
void assemble_hf_into(std::span<const MegatronParam> params,
                      std::span<const std::span<const std::byte>> blocks, int tp,
                      std::span<const std::span<std::byte>> out, std::span<Digest> digests = {});

}  // namespace weightcast::sync::trainer

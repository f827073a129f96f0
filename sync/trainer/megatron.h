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
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

struct MegatronParam {
  std::string name;  // Megatron name, layer index local to the stage
  TpSplit split = TpSplit::kReplicated;
  std::vector<TensorMeta> parts;  // the HF tensors it holds, in order (one unless fused)

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

// The Megatron parameters of one pipeline stage, ordered by their first HF part in
// hf_tensors(spec) order, so converting them back yields the stage's HF tensors in that order.
// ConfigError for an HF name this conversion does not know.
std::vector<MegatronParam> stage_params(const ModelSpec& spec, int stage, int stages);

// The HF tensors of one stage, in hf_tensors(spec) order.
std::vector<TensorMeta> stage_hf_tensors(const ModelSpec& spec, int stage, int stages);

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
// The same into `out`, one HostTensor per part with its bytes already sized (allocate_hf()).
void write_hf(const MegatronParam& param, std::span<const std::span<const std::byte>> shards,
              std::span<HostTensor> out);
// The HF tensors of `params`, in order, with zeroed bytes of their size: what the *_into and
// write_hf functions fill.
std::vector<HostTensor> allocate_hf(std::span<const MegatronParam> params);

// What TP rank `tp_rank` contributes to its stage source's gather at training step `step`: the
// shard of each of `params`, back to back in order, cut from the generator's full HF tensors
// (fill_tensor with `seed`, `step`). Replicated params come from TP rank 0 only; the other ranks
// hold the same bytes, and sending them would only grow the gather.
std::vector<std::byte> rank_shards(const std::vector<MegatronParam>& params, int tp, int tp_rank,
                                   std::uint64_t seed, std::uint64_t step);

// The source's side: the stage's HF tensors, in order, from blocks[r] = rank_shards() of TP rank
// r (blocks.size() is the TP size). EnforceError when a block has the wrong size.
std::vector<HostTensor> assemble_hf(const std::vector<MegatronParam>& params,
                                    std::span<const std::span<const std::byte>> blocks);
// The same into `out` = allocate_hf(params) (or tensors of the same metas and sizes), so a
// source can fill its tensors part by part, in place, while it sends the earlier ones.
void assemble_hf_into(std::span<const MegatronParam> params,
                      std::span<const std::span<const std::byte>> blocks,
                      std::span<HostTensor> out);

}  // namespace weightcast::sync::trainer

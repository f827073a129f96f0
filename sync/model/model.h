// Synthetic models: the shape of a Qwen-like decoder, its HF tensor names, and a deterministic
// generator of its weights, shared by the trainer and the engine.
//
// Neither side loads a real checkpoint. Both derive the same tensor list from a ModelSpec and
// the same bytes from fill_tensor(meta, seed, step): the engine starts from step 0 and the
// trainer, which "trains" by jumping to step k, knows exactly what every engine must hold
// afterwards, so correctness is checked bit for bit, not by sampling.
//
// Names follow HF Qwen2/Qwen3 checkpoints (no biases, no QK-norm). Mixture-of-experts layers
// follow Qwen3-MoE (router mlp.gate.weight, experts mlp.experts.{e}.{gate,up,down}_proj.weight,
// and Qwen2-MoE's optional shared expert mlp.shared_expert.{gate,up,down}_proj.weight with its
// mlp.shared_expert_gate.weight); with multi-head latent attention (kv_lora_rank > 0) a layer
// follows DeepSeek-V3 instead: self_attn.{q_a_proj, kv_a_proj_with_mqa, q_a_layernorm, q_b_proj,
// kv_a_layernorm, kv_b_proj, o_proj} and shared experts mlp.shared_experts.{gate,up,down}_proj.
// The first first_k_dense_replace layers of an MoE model keep the dense MLP. MTP layers follow
// Qwen3-Next's checkpoint naming under "mtp.": mtp.fc.weight, mtp.pre_fc_norm_embedding.weight,
// mtp.pre_fc_norm_hidden.weight, mtp.layers.{j}.<decoder layer>, mtp.norm.weight; they come
// after the main model's tensors. The draft runner of an engine holds draft_tensors(): the MTP
// module when the spec has MTP layers (same names, so trained updates reach it), otherwise a
// frozen EAGLE-style head under "draft." (draft.fc.weight, draft.layers.0.<decoder layer>,
// draft.norm.weight; it shares the target's embedding and lm_head as EAGLE does). The draft's
// names are disjoint from the target's, so the one generator with the one seed gives it
// different bytes; nothing needs a second seed.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sync/protocol/dtype.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

inline constexpr std::string_view kMtpPrefix = "mtp.";
inline constexpr std::string_view kDraftPrefix = "draft.";

struct ModelSpec {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t mtp_num_layers = 0;  // 0: no MTP module
  DType dtype = DType::kBFloat16;
  bool tie_word_embeddings = false;  // true: no lm_head.weight, as in HF
  // Mixture of experts: num_experts 0 is a dense model. Every layer from first_k_dense_replace
  // on has num_experts experts of moe_intermediate_size, and a shared expert of
  // shared_expert_intermediate_size unless that is 0.
  std::int64_t num_experts = 0;
  std::int64_t moe_intermediate_size = 0;
  std::int64_t shared_expert_intermediate_size = 0;
  std::int64_t first_k_dense_replace = 0;
  // Multi-head latent attention (DeepSeek-V2/V3): kv_lora_rank 0 is plain GQA attention, and then
  // the other four are 0 too.
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;

  bool is_moe() const { return num_experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  // Whether decoder layer `layer` (of the main model; MTP layers count as the last ones) has
  // experts.
  bool is_moe_layer(std::int64_t layer) const { return is_moe() && layer >= first_k_dense_replace; }

  bool operator==(const ModelSpec&) const = default;
};

// Throws comm::ConfigError naming the field unless every size is positive (mtp_num_layers
// >= 0), num_attention_heads is a multiple of num_key_value_heads, and every size is within
// sanity limits (dimensions <= 2^22, layers <= 1024) so no tensor size can overflow.
void validate(const ModelSpec& spec);

// Fields named as in an HF config.json: vocab_size, hidden_size, num_hidden_layers,
// num_attention_heads, intermediate_size (required); num_key_value_heads (default
// num_attention_heads), head_dim (default hidden_size / num_attention_heads),
// num_nextn_predict_layers (default 0), torch_dtype (default "bfloat16"), tie_word_embeddings
// (default false); for MoE num_experts (or DeepSeek's n_routed_experts), moe_intermediate_size,
// shared_expert_intermediate_size (or DeepSeek's n_shared_experts * moe_intermediate_size),
// first_k_dense_replace; for MLA q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
// v_head_dim (all default 0; null counts as 0). Integers must be JSON integers, the flag a JSON
// bool. Other keys are ignored so a real config.json loads. Throws comm::ConfigError naming the
// field; the result is validated.
ModelSpec model_spec_from_json(const nlohmann::json& json);
// The fields above, all of them; model_spec_from_json(to_json(s)) == s.
nlohmann::json to_json(const ModelSpec& spec);

// Named presets: "tiny" (~3 MiB, 2 layers, for unit tests), "small" (~64 MiB, 8 layers),
// "qwen3-0.6b" and "qwen3-8b" (the real models' shapes); mixtures of experts in Qwen3-MoE naming
// "moe-tiny" (~5 MiB, 8 experts), "moe-small" (~80 MiB, 16 experts and a shared expert) and
// "moe-1g" (~1 GiB, 64 experts, for benchmarks) and its dense twin "dense-1g" (one MLP as wide as
// the 64 experts: the same bytes within 0.1%); "deepseek-tiny" (~5 MiB, DeepSeek-V3 style: MLA
// attention, one dense layer, then MoE layers with 8 experts and a shared expert). Unknown names
// throw comm::ConfigError listing the valid ones.
ModelSpec model_preset(std::string_view name);
std::vector<std::string_view> model_preset_names();

// A model of about `target_bytes` for benchmarks: the widest shape of a fixed ladder
// (hidden 256 ... 4096) that fits four layers in the target, with as many layers as fit (at
// most 1024). Its size is <= target_bytes and within one layer of it, except below the
// smallest one-layer model (5.5 MiB in bf16), which is then returned.
ModelSpec model_spec_for_bytes(std::size_t target_bytes, DType dtype = DType::kBFloat16);

// Every tensor a trainer sends, in HF order: embed_tokens; per layer input_layernorm,
// self_attn.{q,k,v,o}_proj (MLA: q_a_proj, kv_a_proj_with_mqa, q_a_layernorm, q_b_proj,
// kv_a_layernorm, kv_b_proj, o_proj), post_attention_layernorm, then mlp.{gate,up,down}_proj or,
// in an MoE layer, mlp.gate, each expert's gate/up/down in expert order, the shared expert;
// model.norm; lm_head (unless tied); then the MTP module (its layers as the model's last one).
// Shapes are [out, in] as in torch.nn.Linear.
std::vector<TensorMeta> hf_tensors(const ModelSpec& spec);
// What the target runner holds: hf_tensors() without the MTP module.
std::vector<TensorMeta> target_tensors(const ModelSpec& spec);
// What the draft runner holds (see above).
std::vector<TensorMeta> draft_tensors(const ModelSpec& spec);

// Sum of byte_count() over `metas`.
std::size_t total_bytes(const std::vector<TensorMeta>& metas);

// Fills `out` (exactly meta.byte_count() long, else EnforceError) with the weights of tensor
// meta.name at training step `step` of the run with `seed`. The bytes depend only on (seed,
// step, name, dtype, size): identical on every machine, and a larger tensor of the same name
// and dtype extends the same stream. Floating types get finite, normal values with random sign
// and mantissa: magnitudes in [2^-8, 1) for 16/32/64-bit floats and float8_e5m2, [2^-6, 4) for
// float8_e4m3fn. Integer types get uniform bits, bool 0 or 1. Speed: about 1 GB/s per core.
// Training drift: between steps a floating value keeps its sign, exponent and top four mantissa
// bits and redraws only the low ones, so step k differs from step 0 in almost every element but
// by less than 2^-4 of its value. draft.fc.weight (the frozen EAGLE head) is a near-identity on
// its first h columns (1.0 on the diagonal, other values / 64); see model_fill.cc for why.
void fill_tensor(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step,
                 std::span<std::byte> out);

}  // namespace weightcast::sync

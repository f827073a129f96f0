#include "sync/model/model.h"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 22;
constexpr std::int64_t kMaxLayers = 1024;
constexpr std::int64_t kMaxExperts = 4096;

void check_range(std::string_view field, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    throw comm::ConfigError("model spec: " + std::string(field) + " must be in [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                            std::to_string(value));
  }
}

std::int64_t get_int(const nlohmann::json& j, const char* field,
                     std::optional<std::int64_t> fallback) {
  const auto it = j.find(field);
  if (it == j.end()) {
    if (fallback) return *fallback;
    throw comm::ConfigError(std::string("model spec: missing field '") + field + "'");
  }
  if (!it->is_number_integer()) {
    throw comm::ConfigError(std::string("model spec: field '") + field +
                            "' must be an integer, got " + sync::quoted(it->dump()));
  }
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxDim)) {
    throw comm::ConfigError(std::string("model spec: field '") + field + "' is too large");
  }
  return it->get<std::int64_t>();
}

// An optional integer that real configs may also spell null (DeepSeek's q_lora_rank): the
// fallback then.
std::int64_t get_int_or_null(const nlohmann::json& j, const char* field, std::int64_t fallback) {
  if (const auto it = j.find(field); it != j.end() && it->is_null()) return fallback;
  return get_int(j, field, fallback);
}

// The attention block of a decoder layer: GQA (Qwen) or multi-head latent attention (DeepSeek).
// MLA's two down projections come first, side by side: an engine fuses them into one weight
// (SGLang's fused_qkv_a_proj_with_mqa), so they travel together (sync/model/atomic_groups.h).
void add_attention(std::vector<TensorMeta>& out, const std::string& prefix, const ModelSpec& s) {
  const std::int64_t h = s.hidden_size;
  auto add = [&](const char* name, std::vector<std::int64_t> shape) {
    out.push_back(TensorMeta{prefix + name, s.dtype, std::move(shape)});
  };
  if (s.is_mla()) {
    const std::int64_t heads = s.num_attention_heads;
    add("self_attn.q_a_proj.weight", {s.q_lora_rank, h});
    add("self_attn.kv_a_proj_with_mqa.weight", {s.kv_lora_rank + s.qk_rope_head_dim, h});
    add("self_attn.q_a_layernorm.weight", {s.q_lora_rank});
    add("self_attn.q_b_proj.weight",
        {heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank});
    add("self_attn.kv_a_layernorm.weight", {s.kv_lora_rank});
    add("self_attn.kv_b_proj.weight",
        {heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank});
    add("self_attn.o_proj.weight", {h, heads * s.v_head_dim});
    return;
  }
  const std::int64_t q = s.num_attention_heads * s.head_dim;
  const std::int64_t kv = s.num_key_value_heads * s.head_dim;
  add("self_attn.q_proj.weight", {q, h});
  add("self_attn.k_proj.weight", {kv, h});
  add("self_attn.v_proj.weight", {kv, h});
  add("self_attn.o_proj.weight", {h, q});
}

// gate/up/down projections of width `ff` under `prefix` ("mlp.", "mlp.experts.3.").
void add_mlp(std::vector<TensorMeta>& out, const std::string& prefix, const ModelSpec& s,
             std::int64_t ff) {
  const std::int64_t h = s.hidden_size;
  out.push_back(TensorMeta{prefix + "gate_proj.weight", s.dtype, {ff, h}});
  out.push_back(TensorMeta{prefix + "up_proj.weight", s.dtype, {ff, h}});
  out.push_back(TensorMeta{prefix + "down_proj.weight", s.dtype, {h, ff}});
}

// The router, the experts in index order, and the shared expert (Qwen2-MoE naming with its gate,
// or DeepSeek's without one).
void add_moe(std::vector<TensorMeta>& out, const std::string& prefix, const ModelSpec& s) {
  const std::int64_t h = s.hidden_size;
  out.push_back(TensorMeta{prefix + "mlp.gate.weight", s.dtype, {s.num_experts, h}});
  for (std::int64_t e = 0; e < s.num_experts; ++e) {
    add_mlp(out, prefix + "mlp.experts." + std::to_string(e) + ".", s, s.moe_intermediate_size);
  }
  if (s.shared_expert_intermediate_size == 0) return;
  if (s.is_mla()) {
    add_mlp(out, prefix + "mlp.shared_experts.", s, s.shared_expert_intermediate_size);
    return;
  }
  add_mlp(out, prefix + "mlp.shared_expert.", s, s.shared_expert_intermediate_size);
  out.push_back(TensorMeta{prefix + "mlp.shared_expert_gate.weight", s.dtype, {1, h}});
}

// One decoder layer's tensors, named under `prefix` ("model.layers.3."); `moe`: experts instead
// of the dense MLP.
void add_decoder_layer(std::vector<TensorMeta>& out, const std::string& prefix, const ModelSpec& s,
                       bool moe) {
  const std::int64_t h = s.hidden_size;
  out.push_back(TensorMeta{prefix + "input_layernorm.weight", s.dtype, {h}});
  add_attention(out, prefix, s);
  out.push_back(TensorMeta{prefix + "post_attention_layernorm.weight", s.dtype, {h}});
  if (moe) {
    add_moe(out, prefix, s);
  } else {
    add_mlp(out, prefix + "mlp.", s, s.intermediate_size);
  }
}

void add_mtp_module(std::vector<TensorMeta>& out, const ModelSpec& s) {
  const std::string p(kMtpPrefix);
  const std::int64_t h = s.hidden_size;
  out.push_back(TensorMeta{p + "fc.weight", s.dtype, {h, 2 * h}});
  out.push_back(TensorMeta{p + "pre_fc_norm_embedding.weight", s.dtype, {h}});
  out.push_back(TensorMeta{p + "pre_fc_norm_hidden.weight", s.dtype, {h}});
  for (std::int64_t j = 0; j < s.mtp_num_layers; ++j) {
    add_decoder_layer(out, p + "layers." + std::to_string(j) + ".", s, s.is_moe());
  }
  out.push_back(TensorMeta{p + "norm.weight", s.dtype, {h}});
}

struct Preset {
  std::string_view name;
  ModelSpec spec;
};

// An MoE spec: `dense` with experts (num_experts, moe_intermediate_size, shared expert size,
// first_k_dense_replace).
constexpr ModelSpec with_experts(ModelSpec dense, std::int64_t experts, std::int64_t moe_ff,
                                 std::int64_t shared_ff, std::int64_t first_dense) {
  dense.num_experts = experts;
  dense.moe_intermediate_size = moe_ff;
  dense.shared_expert_intermediate_size = shared_ff;
  dense.first_k_dense_replace = first_dense;
  return dense;
}

// `spec` with multi-head latent attention (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim).
constexpr ModelSpec with_mla(ModelSpec spec, std::int64_t q_lora, std::int64_t kv_lora,
                             std::int64_t nope, std::int64_t rope, std::int64_t v) {
  spec.q_lora_rank = q_lora;
  spec.kv_lora_rank = kv_lora;
  spec.qk_nope_head_dim = nope;
  spec.qk_rope_head_dim = rope;
  spec.v_head_dim = v;
  return spec;
}

// vocab, hidden, layers, heads, kv heads, head_dim, intermediate, mtp, dtype, tied
constexpr std::array<Preset, 9> kPresets = {{
    {"tiny", {1024, 256, 2, 4, 2, 64, 512, 0, DType::kBFloat16, false}},
    {"small", {8192, 512, 8, 8, 4, 64, 1536, 0, DType::kBFloat16, false}},
    {"qwen3-0.6b", {151936, 1024, 28, 16, 8, 128, 3072, 0, DType::kBFloat16, true}},
    {"qwen3-8b", {151936, 4096, 36, 32, 8, 128, 12288, 0, DType::kBFloat16, false}},
    {"moe-tiny",
     with_experts({1024, 256, 2, 4, 2, 64, 512, 0, DType::kBFloat16, false}, 8, 128, 0, 0)},
    {"moe-small",
     with_experts({8192, 512, 4, 8, 4, 64, 1536, 0, DType::kBFloat16, false}, 16, 256, 512, 0)},
    {"moe-1g",
     with_experts({32768, 1024, 9, 16, 4, 64, 3072, 0, DType::kBFloat16, false}, 64, 256, 0, 0)},
    // moe-1g's dense twin: one MLP as wide as its 64 experts, the same bytes within 0.1%.
    {"dense-1g", {32768, 1024, 9, 16, 4, 64, 16384, 0, DType::kBFloat16, false}},
    {"deepseek-tiny",
     with_mla(
         with_experts({1024, 256, 3, 4, 4, 64, 512, 0, DType::kBFloat16, false}, 8, 128, 128, 1),
         128, 64, 32, 16, 32)},
}};

// Shapes for model_spec_for_bytes(), narrowest first; num_layers is filled in.
constexpr std::array<ModelSpec, 5> kLadder = {{
    {4096, 256, 0, 4, 2, 64, 768, 0, DType::kBFloat16, false},
    {8192, 512, 0, 8, 4, 64, 1536, 0, DType::kBFloat16, false},
    {16384, 1024, 0, 16, 8, 64, 3072, 0, DType::kBFloat16, false},
    {32768, 2048, 0, 16, 8, 128, 6144, 0, DType::kBFloat16, false},
    {65536, 4096, 0, 32, 8, 128, 12288, 0, DType::kBFloat16, false},
}};

std::size_t spec_bytes(const ModelSpec& spec) {
  return total_bytes(hf_tensors(spec));
}

}  // namespace

void validate(const ModelSpec& s) {
  check_range("vocab_size", s.vocab_size, 1, kMaxDim);
  check_range("hidden_size", s.hidden_size, 1, kMaxDim);
  check_range("num_hidden_layers", s.num_layers, 1, kMaxLayers);
  check_range("num_attention_heads", s.num_attention_heads, 1, kMaxDim);
  check_range("num_key_value_heads", s.num_key_value_heads, 1, s.num_attention_heads);
  check_range("head_dim", s.head_dim, 1, kMaxDim);
  check_range("intermediate_size", s.intermediate_size, 1, kMaxDim);
  check_range("num_nextn_predict_layers", s.mtp_num_layers, 0, kMaxLayers);
  check_range("num_attention_heads * head_dim", s.num_attention_heads * s.head_dim, 1, kMaxDim);
  check_range("num_experts", s.num_experts, 0, kMaxExperts);
  if (s.is_moe()) {
    check_range("moe_intermediate_size", s.moe_intermediate_size, 1, kMaxDim);
    check_range("shared_expert_intermediate_size", s.shared_expert_intermediate_size, 0, kMaxDim);
    check_range("first_k_dense_replace", s.first_k_dense_replace, 0, s.num_layers);
  } else {
    check_range("moe_intermediate_size (dense model)", s.moe_intermediate_size, 0, 0);
    check_range("shared_expert_intermediate_size (dense model)", s.shared_expert_intermediate_size,
                0, 0);
    check_range("first_k_dense_replace (dense model)", s.first_k_dense_replace, 0, 0);
  }
  check_range("kv_lora_rank", s.kv_lora_rank, 0, kMaxDim);
  const std::int64_t mla_lo = s.is_mla() ? 1 : 0;
  const std::int64_t mla_hi = s.is_mla() ? kMaxDim : 0;
  check_range("q_lora_rank", s.q_lora_rank, mla_lo, mla_hi);
  check_range("qk_nope_head_dim", s.qk_nope_head_dim, mla_lo, mla_hi);
  check_range("qk_rope_head_dim", s.qk_rope_head_dim, mla_lo, mla_hi);
  check_range("v_head_dim", s.v_head_dim, mla_lo, mla_hi);
  check_range(
      "num_attention_heads * (qk_nope_head_dim + max(qk_rope_head_dim, v_head_dim))",
      s.num_attention_heads * (s.qk_nope_head_dim + std::max(s.qk_rope_head_dim, s.v_head_dim)), 0,
      kMaxDim);
  if (s.num_attention_heads % s.num_key_value_heads != 0) {
    throw comm::ConfigError("model spec: num_attention_heads (" +
                            std::to_string(s.num_attention_heads) +
                            ") must be a multiple of num_key_value_heads (" +
                            std::to_string(s.num_key_value_heads) + ")");
  }
  (void)element_size(s.dtype);
}

ModelSpec model_spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw comm::ConfigError("model spec: expected a JSON object");
  ModelSpec s;
  s.vocab_size = get_int(j, "vocab_size", std::nullopt);
  s.hidden_size = get_int(j, "hidden_size", std::nullopt);
  s.num_layers = get_int(j, "num_hidden_layers", std::nullopt);
  s.num_attention_heads = get_int(j, "num_attention_heads", std::nullopt);
  s.intermediate_size = get_int(j, "intermediate_size", std::nullopt);
  s.num_key_value_heads = get_int(j, "num_key_value_heads", s.num_attention_heads);
  // HF's default; a bad head count is reported by validate() below.
  const std::int64_t head_dim =
      s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0;
  s.head_dim = get_int(j, "head_dim", head_dim);
  s.mtp_num_layers = get_int(j, "num_nextn_predict_layers", 0);
  s.num_experts = get_int_or_null(j, "num_experts", get_int_or_null(j, "n_routed_experts", 0));
  s.moe_intermediate_size = get_int_or_null(j, "moe_intermediate_size", 0);
  s.shared_expert_intermediate_size =
      get_int_or_null(j, "shared_expert_intermediate_size",
                      get_int_or_null(j, "n_shared_experts", 0) * s.moe_intermediate_size);
  s.first_k_dense_replace = get_int_or_null(j, "first_k_dense_replace", 0);
  s.q_lora_rank = get_int_or_null(j, "q_lora_rank", 0);
  s.kv_lora_rank = get_int_or_null(j, "kv_lora_rank", 0);
  s.qk_nope_head_dim = get_int_or_null(j, "qk_nope_head_dim", 0);
  s.qk_rope_head_dim = get_int_or_null(j, "qk_rope_head_dim", 0);
  s.v_head_dim = get_int_or_null(j, "v_head_dim", 0);
  if (const auto it = j.find("torch_dtype"); it != j.end()) {
    if (!it->is_string()) throw comm::ConfigError("model spec: torch_dtype must be a string");
    try {
      s.dtype = parse_dtype(it->get<std::string>());
    } catch (const comm::BadRequestError& e) {
      throw comm::ConfigError(std::string("model spec: torch_dtype: ") + e.what());
    }
  }
  if (const auto it = j.find("tie_word_embeddings"); it != j.end()) {
    if (!it->is_boolean()) {
      throw comm::ConfigError("model spec: tie_word_embeddings must be true or false");
    }
    s.tie_word_embeddings = it->get<bool>();
  }
  validate(s);
  return s;
}

nlohmann::json to_json(const ModelSpec& s) {
  return nlohmann::json{
      {"vocab_size", s.vocab_size},
      {"hidden_size", s.hidden_size},
      {"num_hidden_layers", s.num_layers},
      {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_key_value_heads},
      {"head_dim", s.head_dim},
      {"intermediate_size", s.intermediate_size},
      {"num_nextn_predict_layers", s.mtp_num_layers},
      {"torch_dtype", std::string(to_string(s.dtype))},
      {"tie_word_embeddings", s.tie_word_embeddings},
      {"num_experts", s.num_experts},
      {"moe_intermediate_size", s.moe_intermediate_size},
      {"shared_expert_intermediate_size", s.shared_expert_intermediate_size},
      {"first_k_dense_replace", s.first_k_dense_replace},
      {"q_lora_rank", s.q_lora_rank},
      {"kv_lora_rank", s.kv_lora_rank},
      {"qk_nope_head_dim", s.qk_nope_head_dim},
      {"qk_rope_head_dim", s.qk_rope_head_dim},
      {"v_head_dim", s.v_head_dim},
  };
}

ModelSpec model_preset(std::string_view name) {
  for (const auto& p : kPresets) {
    if (p.name == name) return p.spec;
  }
  std::string valid;
  for (const auto& p : kPresets) valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  throw comm::ConfigError("unknown model preset " + sync::quoted(name) + " (valid: " + valid + ")");
}

std::vector<std::string_view> model_preset_names() {
  std::vector<std::string_view> out;
  for (const auto& p : kPresets) out.push_back(p.name);
  return out;
}

ModelSpec model_spec_for_bytes(std::size_t target_bytes, DType dtype) {
  ModelSpec chosen = kLadder.front();
  for (const ModelSpec& shape : kLadder) {
    ModelSpec four = shape;
    four.dtype = dtype;
    four.num_layers = 4;
    if (spec_bytes(four) <= target_bytes) chosen = shape;
  }
  chosen.dtype = dtype;
  chosen.num_layers = 1;
  const std::size_t one = spec_bytes(chosen);
  chosen.num_layers = 2;
  const std::size_t per_layer = spec_bytes(chosen) - one;
  chosen.num_layers = 1;
  if (target_bytes > one) {
    const std::size_t extra = (target_bytes - one) / per_layer;
    chosen.num_layers = static_cast<std::int64_t>(
        std::min<std::size_t>(1 + extra, static_cast<std::size_t>(kMaxLayers)));
  }
  return chosen;
}

std::vector<TensorMeta> hf_tensors(const ModelSpec& spec) {
  validate(spec);
  std::vector<TensorMeta> out = target_tensors(spec);
  if (spec.mtp_num_layers > 0) add_mtp_module(out, spec);
  return out;
}

std::vector<TensorMeta> target_tensors(const ModelSpec& s) {
  validate(s);
  std::vector<TensorMeta> out;
  out.push_back(TensorMeta{"model.embed_tokens.weight", s.dtype, {s.vocab_size, s.hidden_size}});
  for (std::int64_t i = 0; i < s.num_layers; ++i) {
    add_decoder_layer(out, "model.layers." + std::to_string(i) + ".", s, s.is_moe_layer(i));
  }
  out.push_back(TensorMeta{"model.norm.weight", s.dtype, {s.hidden_size}});
  if (!s.tie_word_embeddings) {
    out.push_back(TensorMeta{"lm_head.weight", s.dtype, {s.vocab_size, s.hidden_size}});
  }
  return out;
}

std::vector<TensorMeta> draft_tensors(const ModelSpec& s) {
  validate(s);
  std::vector<TensorMeta> out;
  if (s.mtp_num_layers > 0) {
    add_mtp_module(out, s);
    return out;
  }
  const std::string p(kDraftPrefix);
  const std::int64_t h = s.hidden_size;
  out.push_back(TensorMeta{p + "fc.weight", s.dtype, {h, 2 * h}});
  add_decoder_layer(out, p + "layers.0.", s, false);  // an EAGLE head is dense
  out.push_back(TensorMeta{p + "norm.weight", s.dtype, {h}});
  return out;
}

std::size_t total_bytes(const std::vector<TensorMeta>& metas) {
  std::size_t sum = 0;
  for (const auto& m : metas) {
    const std::size_t b = m.byte_count();
    WC_ENFORCE_LE(b, std::numeric_limits<std::size_t>::max() - sum, "model size overflows");
    sum += b;
  }
  return sum;
}

}  // namespace weightcast::sync

// The name mapping between HF tensors and Megatron parameters (sync/trainer/megatron.h): which
// Megatron parameter holds an HF tensor, on which pipeline stage and EP rank, split how over TP.
#include <algorithm>
#include <array>
#include <optional>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/trainer/megatron.h"

namespace weightcast::sync::trainer {

namespace {

// One Megatron tensor and the HF tensors it holds: more than one only for kFusedDim0, whose parts
// stack along dim 0 (q, k, v; gate, up).
struct Rule {
  std::string_view megatron;  // Megatron suffix (layer tensors) or full name (top-level tensors)
  TpSplit split;
  std::array<std::string_view, 3> hf;  // HF suffixes or full names; unused ones are empty
};

// A decoder layer's tensors, relative to "model.layers.{i}." / "mtp.layers.{j}.": the attention
// block (GQA or MLA) and the MLP block (dense or MoE) each have their own table, as the same HF
// norm lives under a different Megatron name in each kind.
constexpr Rule kGqaRules[] = {
    {"self_attention.linear_qkv.layer_norm_weight",
     TpSplit::kReplicated,
     {"input_layernorm.weight"}},
    {"self_attention.linear_qkv.weight",
     TpSplit::kFusedDim0,
     {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
    {"self_attention.linear_qkv.bias",
     TpSplit::kFusedDim0,
     {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}},
    {"self_attention.q_layernorm.weight", TpSplit::kReplicated, {"self_attn.q_norm.weight"}},
    {"self_attention.k_layernorm.weight", TpSplit::kReplicated, {"self_attn.k_norm.weight"}},
    {"self_attention.linear_proj.weight", TpSplit::kDim1, {"self_attn.o_proj.weight"}},
};

constexpr Rule kMlaRules[] = {
    {"input_layernorm.weight", TpSplit::kReplicated, {"input_layernorm.weight"}},
    {"self_attention.linear_q_down_proj.weight",
     TpSplit::kReplicated,
     {"self_attn.q_a_proj.weight"}},
    {"self_attention.linear_kv_down_proj.weight",
     TpSplit::kReplicated,
     {"self_attn.kv_a_proj_with_mqa.weight"}},
    {"self_attention.linear_q_up_proj.layer_norm_weight",
     TpSplit::kReplicated,
     {"self_attn.q_a_layernorm.weight"}},
    {"self_attention.linear_q_up_proj.weight", TpSplit::kDim0, {"self_attn.q_b_proj.weight"}},
    {"self_attention.linear_kv_up_proj.layer_norm_weight",
     TpSplit::kReplicated,
     {"self_attn.kv_a_layernorm.weight"}},
    {"self_attention.linear_kv_up_proj.weight", TpSplit::kDim0, {"self_attn.kv_b_proj.weight"}},
    {"self_attention.linear_proj.weight", TpSplit::kDim1, {"self_attn.o_proj.weight"}},
};

constexpr Rule kDenseMlpRules[] = {
    {"mlp.linear_fc1.layer_norm_weight", TpSplit::kReplicated, {"post_attention_layernorm.weight"}},
    {"mlp.linear_fc1.weight", TpSplit::kFusedDim0, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
    {"mlp.linear_fc2.weight", TpSplit::kDim1, {"mlp.down_proj.weight"}},
};

// The experts themselves are mapped by expert_placement().
constexpr Rule kMoeRules[] = {
    {"pre_mlp_layernorm.weight", TpSplit::kReplicated, {"post_attention_layernorm.weight"}},
    {"mlp.router.weight", TpSplit::kReplicated, {"mlp.gate.weight"}},
    {"mlp.shared_experts.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"}},
    {"mlp.shared_experts.linear_fc2.weight",
     TpSplit::kDim1,
     {"mlp.shared_expert.down_proj.weight"}},
    {"mlp.shared_experts.gate_weight", TpSplit::kReplicated, {"mlp.shared_expert_gate.weight"}},
    // DeepSeek names its shared experts in the plural.
    {"mlp.shared_experts.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"}},
    {"mlp.shared_experts.linear_fc2.weight",
     TpSplit::kDim1,
     {"mlp.shared_experts.down_proj.weight"}},
};

// Tensors outside the decoder layers.
constexpr Rule kTopRules[] = {
    {"embedding.word_embeddings.weight", TpSplit::kDim0, {"model.embed_tokens.weight"}},
    {"decoder.final_layernorm.weight", TpSplit::kReplicated, {"model.norm.weight"}},
    {"output_layer.weight", TpSplit::kDim0, {"lm_head.weight"}},
    {"mtp.eh_proj.weight", TpSplit::kDim0, {"mtp.fc.weight"}},
    {"mtp.enorm.weight", TpSplit::kReplicated, {"mtp.pre_fc_norm_embedding.weight"}},
    {"mtp.hnorm.weight", TpSplit::kReplicated, {"mtp.pre_fc_norm_hidden.weight"}},
    {"mtp.final_layernorm.weight", TpSplit::kReplicated, {"mtp.norm.weight"}},
};

// Parses a decimal index (digits only, at most 9 of them); nullopt otherwise.
std::optional<std::int64_t> parse_index(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  std::int64_t index = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return index;
}

// "model.layers.12.mlp.up_proj.weight" -> (12, "mlp.up_proj.weight") for `prefix` "model.layers.".
std::optional<std::pair<std::int64_t, std::string_view>> split_layer(std::string_view name,
                                                                     std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  const auto dot = name.find('.');
  // No index, or nothing after it ("model.layers.3."): not a layer tensor.
  if (dot == std::string_view::npos || dot + 1 == name.size()) return std::nullopt;
  const auto index = parse_index(name.substr(0, dot));
  if (!index) return std::nullopt;
  return std::make_pair(*index, name.substr(dot + 1));
}

const Rule* find_in(std::string_view key, std::span<const Rule> rules) {
  for (const auto& rule : rules) {
    if (std::ranges::find(rule.hf, key) != rule.hf.end()) return &rule;
  }
  return nullptr;
}

[[noreturn]] void no_mapping(const std::string& name) {
  throw comm::ConfigError("raw conversion: no Megatron mapping for tensor '" + name + "'");
}

const Rule& find_rule(std::string_view key, std::span<const Rule> rules, const std::string& name) {
  if (const Rule* rule = find_in(key, rules)) return *rule;
  no_mapping(name);
}

// A layer tensor's rule: from the attention table of the model's kind, then the MLP table of the
// layer's kind.
const Rule& find_layer_rule(std::string_view key, const ModelSpec& spec, bool moe,
                            const std::string& name) {
  const std::span<const Rule> attention =
      spec.is_mla() ? std::span<const Rule>(kMlaRules) : std::span<const Rule>(kGqaRules);
  const std::span<const Rule> mlp =
      moe ? std::span<const Rule>(kMoeRules) : std::span<const Rule>(kDenseMlpRules);
  if (const Rule* rule = find_in(key, attention)) return *rule;
  return find_rule(key, mlp, name);
}

// Where an HF tensor lives: its stage, its Megatron name and split, and its EP rank (-1: every).
struct Placement {
  int stage = 0;
  std::string megatron;
  TpSplit split = TpSplit::kReplicated;
  int ep_rank = -1;
};

// "mlp.experts.17.up_proj.weight" -> the Megatron suffix of expert 17 on its EP rank.
std::optional<Placement> expert_placement(std::string_view key, const ModelSpec& spec,
                                          const ExpertParallel& experts) {
  constexpr std::string_view kPrefix = "mlp.experts.";
  if (!key.starts_with(kPrefix)) return std::nullopt;
  key.remove_prefix(kPrefix.size());
  const auto dot = key.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto expert = parse_index(key.substr(0, dot));
  const std::string_view member = key.substr(dot + 1);
  const bool fc1 = member == "gate_proj.weight" || member == "up_proj.weight";
  if (!expert || *expert >= spec.num_experts || (!fc1 && member != "down_proj.weight")) {
    return std::nullopt;
  }
  const std::int64_t local_count = spec.num_experts / experts.ep;
  const auto ep_rank = static_cast<int>(*expert / local_count);
  const std::string local = std::to_string(*expert % local_count);
  const std::string fc = fc1 ? "linear_fc1" : "linear_fc2";
  Placement out;
  out.megatron = experts.layout == ExpertLayout::kLocalExperts
                     ? "mlp.experts.local_experts." + local + "." + fc + ".weight"
                     : "mlp.experts." + fc + ".weight" + local;
  out.split = fc1 ? TpSplit::kFusedDim0 : TpSplit::kDim1;
  out.ep_rank = ep_rank;
  return out;
}

// A layer tensor (`key` relative to its layer, `moe`: the layer has experts) under `prefix`.
Placement layer_placement(const TensorMeta& meta, std::string_view key, const ModelSpec& spec,
                          bool moe, const ExpertParallel& experts, const std::string& prefix) {
  if (moe) {
    if (auto expert = expert_placement(key, spec, experts)) {
      expert->megatron = prefix + expert->megatron;
      return *expert;
    }
  }
  const Rule& rule = find_layer_rule(key, spec, moe, meta.name);
  return {0, prefix + std::string(rule.megatron), rule.split, -1};
}

Placement place(const TensorMeta& meta, const ModelSpec& spec, int stages,
                const ExpertParallel& experts) {
  const int last = stages - 1;
  if (auto layer = split_layer(meta.name, "model.layers.")) {
    int stage = 0;
    while (stage < last && layer->first >= stage_layers(spec, stage + 1, stages).first) ++stage;
    const std::int64_t local = layer->first - stage_layers(spec, stage, stages).first;
    Placement out = layer_placement(meta, layer->second, spec, spec.is_moe_layer(layer->first),
                                    experts, "decoder.layers." + std::to_string(local) + ".");
    out.stage = stage;
    return out;
  }
  if (auto layer = split_layer(meta.name, "mtp.layers.")) {
    Placement out =
        layer_placement(meta, layer->second, spec, spec.is_moe(), experts,
                        "mtp.layers." + std::to_string(layer->first) + ".transformer_layer.");
    out.stage = last;
    return out;
  }
  const Rule& rule = find_rule(meta.name, kTopRules, meta.name);
  const int stage = meta.name == "model.embed_tokens.weight" ? 0 : last;
  return {stage, std::string(rule.megatron), rule.split, -1};
}

void check_experts(const ModelSpec& spec, const ExpertParallel& experts) {
  if (experts.ep < 1) {
    throw comm::ConfigError("expert parallel size must be >= 1, got " + std::to_string(experts.ep));
  }
  if (experts.ep > 1 && !spec.is_moe()) {
    throw comm::ConfigError("expert parallel size " + std::to_string(experts.ep) +
                            " needs a mixture-of-experts model (this one has no experts)");
  }
  if (spec.is_moe() && spec.num_experts % experts.ep != 0) {
    throw comm::ConfigError("expert parallel size " + std::to_string(experts.ep) +
                            " does not divide the model's " + std::to_string(spec.num_experts) +
                            " experts");
  }
}

}  // namespace

std::string_view to_string(ExpertLayout layout) {
  static constexpr auto kNames = comm::enum_names<ExpertLayout>(
      "expert layout",
      {{ExpertLayout::kLocalExperts, "local"}, {ExpertLayout::kGroupedGemm, "grouped"}});
  return kNames.name_or(layout, "?");
}

ExpertLayout parse_expert_layout(std::string_view text) {
  if (text == "local") return ExpertLayout::kLocalExperts;
  if (text == "grouped") return ExpertLayout::kGroupedGemm;
  throw comm::ConfigError("expert layout must be local or grouped, got '" + std::string(text) +
                          "'");
}

std::vector<MegatronParam> stage_params(const ModelSpec& spec, int stage, int stages,
                                        const ExpertParallel& experts) {
  stage_layers(spec, stage, stages);  // validates
  check_experts(spec, experts);
  std::vector<MegatronParam> out;
  for (const TensorMeta& meta : hf_tensors(spec)) {
    Placement where = place(meta, spec, stages, experts);
    if (where.stage != stage) continue;
    if (where.split == TpSplit::kFusedDim0 && !out.empty() && out.back().name == where.megatron &&
        out.back().ep_rank == where.ep_rank) {
      WC_ENFORCE(out.back().dtype() == meta.dtype, "fused parts of ", where.megatron,
                 " differ in dtype");
      out.back().parts.push_back(meta);
      continue;
    }
    out.push_back(MegatronParam{std::move(where.megatron), where.split, {meta}, where.ep_rank});
  }
  return out;
}

std::vector<TensorMeta> stage_hf_tensors(const ModelSpec& spec, int stage, int stages) {
  std::vector<TensorMeta> out;
  for (const auto& param : stage_params(spec, stage, stages)) {
    out.insert(out.end(), param.parts.begin(), param.parts.end());
  }
  return out;
}

std::vector<std::string> hf_names(const ModelSpec& spec, int stage, int stages,
                                  const ExpertParallel& experts, int ep_rank,
                                  std::string_view megatron) {
  for (const auto& param : stage_params(spec, stage, stages, experts)) {
    if (param.name != megatron || (param.ep_rank >= 0 && param.ep_rank != ep_rank)) continue;
    std::vector<std::string> out;
    for (const auto& part : param.parts) out.push_back(part.name);
    return out;
  }
  throw comm::ConfigError("no Megatron parameter '" + std::string(megatron) + "' on stage " +
                          std::to_string(stage) + " of " + std::to_string(stages) + " at EP rank " +
                          std::to_string(ep_rank) + " of " + std::to_string(experts.ep));
}

}  // namespace weightcast::sync::trainer

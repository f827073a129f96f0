#include "sync/trainer/megatron.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "comm/enum_names.h"
#include "comm/errors.h"

namespace weightcast::sync::trainer {

namespace {

// One Megatron tensor and the HF tensors it holds: more than one only for kFusedDim0, whose parts
// stack along dim 0 (q, k, v; gate, up).
struct Rule {
  std::string_view megatron;  // Megatron suffix (layer tensors) or full name (top-level tensors)
  TpSplit split;
  std::array<std::string_view, 3> hf;  // HF suffixes or full names; unused ones are empty
};

// Tensors of one decoder layer, relative to "model.layers.{i}." / "mtp.layers.{j}.".
constexpr Rule kLayerRules[] = {
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
    {"mlp.linear_fc1.layer_norm_weight", TpSplit::kReplicated, {"post_attention_layernorm.weight"}},
    {"mlp.linear_fc1.weight", TpSplit::kFusedDim0, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
    {"mlp.linear_fc2.weight", TpSplit::kDim1, {"mlp.down_proj.weight"}},
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

// "model.layers.12.mlp.up_proj.weight" -> (12, "mlp.up_proj.weight") for `prefix` "model.layers.".
std::optional<std::pair<std::int64_t, std::string_view>> split_layer(std::string_view name,
                                                                     std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  const auto dot = name.find('.');
  // No index, or nothing after it ("model.layers.3."): not a layer tensor.
  if (dot == 0 || dot == std::string_view::npos || dot + 1 == name.size()) return std::nullopt;
  std::int64_t index = 0;
  for (char c : name.substr(0, dot)) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return std::make_pair(index, name.substr(dot + 1));
}

const Rule& find_rule(std::string_view key, std::span<const Rule> rules, const std::string& name) {
  for (const auto& rule : rules) {
    if (std::ranges::find(rule.hf, key) != rule.hf.end()) return rule;
  }
  throw comm::ConfigError("raw conversion: no Megatron mapping for tensor '" + name + "'");
}

// Where an HF tensor lives: its stage, and its Megatron name and split.
struct Placement {
  int stage = 0;
  std::string megatron;
  TpSplit split = TpSplit::kReplicated;
};

Placement place(const TensorMeta& meta, const ModelSpec& spec, int stages) {
  const int last = stages - 1;
  if (auto layer = split_layer(meta.name, "model.layers.")) {
    const Rule& rule = find_rule(layer->second, kLayerRules, meta.name);
    int stage = 0;
    while (stage < last && layer->first >= stage_layers(spec, stage + 1, stages).first) ++stage;
    const std::int64_t local = layer->first - stage_layers(spec, stage, stages).first;
    return {stage, "decoder.layers." + std::to_string(local) + "." + std::string(rule.megatron),
            rule.split};
  }
  if (auto layer = split_layer(meta.name, "mtp.layers.")) {
    const Rule& rule = find_rule(layer->second, kLayerRules, meta.name);
    return {last,
            "mtp.layers." + std::to_string(layer->first) + ".transformer_layer." +
                std::string(rule.megatron),
            rule.split};
  }
  const Rule& rule = find_rule(meta.name, kTopRules, meta.name);
  const int stage = meta.name == "model.embed_tokens.weight" ? 0 : last;
  return {stage, std::string(rule.megatron), rule.split};
}

std::int64_t rows_of(const TensorMeta& meta) {
  return meta.shape.empty() ? 1 : meta.shape[0];
}

// Bytes of one row (everything after dim 0).
std::size_t row_bytes(const TensorMeta& meta) {
  const auto rows = rows_of(meta);
  return rows == 0 ? 0 : meta.byte_count() / static_cast<std::size_t>(rows);
}

}  // namespace

std::string_view to_string(TpSplit split) {
  static constexpr auto kNames =
      comm::enum_names<TpSplit>("tensor-parallel split", {{TpSplit::kReplicated, "replicated"},
                                                          {TpSplit::kDim0, "dim0"},
                                                          {TpSplit::kDim1, "dim1"},
                                                          {TpSplit::kFusedDim0, "fused-dim0"}});
  return kNames.name_or(split, "?");
}

std::vector<std::int64_t> MegatronParam::shape() const {
  std::vector<std::int64_t> out = parts.front().shape;
  if (!out.empty()) {
    out[0] = 0;
    for (const auto& part : parts) out[0] += rows_of(part);
  }
  return out;
}

std::size_t MegatronParam::byte_count() const {
  std::size_t total = 0;
  for (const auto& part : parts) total += part.byte_count();
  return total;
}

StageLayers stage_layers(const ModelSpec& spec, int stage, int stages) {
  if (stages < 1 || stage < 0 || stage >= stages) {
    throw comm::ConfigError("pipeline stage " + std::to_string(stage) + " of " +
                            std::to_string(stages) + " does not exist");
  }
  if (spec.num_layers < stages) {
    throw comm::ConfigError("pipeline parallel size " + std::to_string(stages) +
                            " exceeds the model's " + std::to_string(spec.num_layers) +
                            " layers: every stage needs at least one");
  }
  return {stage * spec.num_layers / stages, (stage + 1) * spec.num_layers / stages};
}

std::vector<MegatronParam> stage_params(const ModelSpec& spec, int stage, int stages) {
  stage_layers(spec, stage, stages);  // validates
  std::vector<MegatronParam> out;
  for (const TensorMeta& meta : hf_tensors(spec)) {
    Placement where = place(meta, spec, stages);
    if (where.stage != stage) continue;
    if (where.split == TpSplit::kFusedDim0 && !out.empty() && out.back().name == where.megatron) {
      WC_ENFORCE(out.back().dtype() == meta.dtype, "fused parts of ", where.megatron,
                 " differ in dtype");
      out.back().parts.push_back(meta);
      continue;
    }
    out.push_back(MegatronParam{std::move(where.megatron), where.split, {meta}});
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

void check_tp_divisible(const std::vector<MegatronParam>& params, int tp) {
  WC_ENFORCE_GE(tp, 1);
  for (const auto& param : params) {
    for (const auto& part : param.parts) {
      std::size_t dim = 0;
      if (param.split == TpSplit::kReplicated) continue;
      if (param.split == TpSplit::kDim1) {
        if (part.shape.size() != 2) {
          throw comm::ConfigError("tensor '" + part.name + "': row-parallel split needs 2 dims");
        }
        dim = 1;
      }
      const std::int64_t extent = part.shape.empty() ? 1 : part.shape[dim];
      if (extent % tp != 0) {
        throw comm::ConfigError("tensor '" + part.name + "' dim " + std::to_string(dim) + " (" +
                                std::to_string(extent) + ") is not divisible by tp " +
                                std::to_string(tp));
      }
    }
  }
}

std::size_t shard_bytes(const MegatronParam& param, int tp) {
  const std::size_t full = param.byte_count();
  return param.split == TpSplit::kReplicated ? full : full / static_cast<std::size_t>(tp);
}

void append_shard(const MegatronParam& param, int tp, int tp_rank, const HfBytes& hf,
                  std::vector<std::byte>& out) {
  WC_ENFORCE(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  const auto add = [&out](std::span<const std::byte> piece) {
    out.insert(out.end(), piece.begin(), piece.end());
  };
  for (const auto& part : param.parts) {
    std::span<const std::byte> full = hf(part);
    WC_ENFORCE_EQ(full.size(), part.byte_count(), "bytes of ", part.name);
    const auto t = static_cast<std::size_t>(tp);
    const auto r = static_cast<std::size_t>(tp_rank);
    switch (param.split) {
      case TpSplit::kReplicated:
        add(full);
        break;
      case TpSplit::kDim0:
      case TpSplit::kFusedDim0:
        add(full.subspan(r * (full.size() / t), full.size() / t));
        break;
      case TpSplit::kDim1: {
        const auto rows = static_cast<std::size_t>(part.shape[0]);
        const std::size_t row = rows == 0 ? 0 : full.size() / rows;
        for (std::size_t i = 0; i < rows; ++i) add(full.subspan(i * row + r * (row / t), row / t));
        break;
      }
    }
  }
}

void write_hf(const MegatronParam& param, std::span<const std::span<const std::byte>> shards,
              std::span<HostTensor> out) {
  WC_ENFORCE(!shards.empty(), "no shards for ", param.name);
  WC_ENFORCE_EQ(out.size(), param.parts.size(), "HF tensors of ", param.name);
  const std::size_t t = shards.size();
  const std::size_t expected = shard_bytes(param, static_cast<int>(t));
  const std::size_t used = param.split == TpSplit::kReplicated ? 1 : t;
  for (std::size_t r = 0; r < used; ++r) {
    WC_ENFORCE_EQ(shards[r].size(), expected, "shard ", r, " of ", param.name);
  }
  std::size_t part_offset = 0;  // within each shard: where the current part's slice starts
  for (std::size_t p = 0; p < param.parts.size(); ++p) {
    const TensorMeta& part = param.parts[p];
    const std::size_t full = part.byte_count();
    WC_ENFORCE_EQ(out[p].bytes.size(), full, "bytes of ", part.name);
    std::byte* dst = out[p].bytes.data();
    switch (param.split) {
      case TpSplit::kReplicated:
        if (full > 0) std::memcpy(dst, shards[0].data() + part_offset, full);
        part_offset += full;
        break;
      case TpSplit::kDim0:
      case TpSplit::kFusedDim0:
        for (std::size_t r = 0; r < t; ++r) {
          if (full > 0) std::memcpy(dst + r * (full / t), shards[r].data() + part_offset, full / t);
        }
        part_offset += full / t;
        break;
      case TpSplit::kDim1: {
        const auto rows = static_cast<std::size_t>(part.shape[0]);
        const std::size_t row = row_bytes(part);
        const std::size_t piece = row / t;
        for (std::size_t r = 0; r < t; ++r) {
          for (std::size_t i = 0; i < rows; ++i) {
            std::memcpy(dst + i * row + r * piece, shards[r].data() + part_offset + i * piece,
                        piece);
          }
        }
        part_offset += full / t;
        break;
      }
    }
  }
}

std::vector<HostTensor> allocate_hf(std::span<const MegatronParam> params) {
  std::vector<HostTensor> out;
  for (const auto& param : params) {
    for (const auto& part : param.parts) {
      out.push_back({part, std::vector<std::byte>(part.byte_count())});
    }
  }
  return out;
}

std::vector<HostTensor> to_hf(const MegatronParam& param,
                              std::span<const std::span<const std::byte>> shards) {
  std::vector<HostTensor> out = allocate_hf({&param, 1});
  write_hf(param, shards, out);
  return out;
}

std::vector<std::byte> rank_shards(const std::vector<MegatronParam>& params, int tp, int tp_rank,
                                   std::uint64_t seed, std::uint64_t step) {
  std::vector<std::byte> out;
  std::vector<std::byte> full;
  const HfBytes generate = [&](const TensorMeta& meta) -> std::span<const std::byte> {
    full.resize(meta.byte_count());
    fill_tensor(meta, seed, step, full);
    return full;
  };
  for (const auto& param : params) {
    if (param.split == TpSplit::kReplicated && tp_rank != 0) continue;
    append_shard(param, tp, tp_rank, generate, out);
  }
  return out;
}

void assemble_hf_into(std::span<const MegatronParam> params,
                      std::span<const std::span<const std::byte>> blocks,
                      std::span<HostTensor> out) {
  const int tp = static_cast<int>(blocks.size());
  WC_ENFORCE_GE(tp, 1);
  std::vector<std::size_t> offset(blocks.size(), 0);
  std::vector<std::span<const std::byte>> shards(blocks.size());
  std::size_t next = 0;  // the first HF tensor of the current param in `out`
  for (const auto& param : params) {
    const std::size_t bytes = shard_bytes(param, tp);
    const std::size_t ranks = param.split == TpSplit::kReplicated ? 1 : blocks.size();
    for (std::size_t r = 0; r < ranks; ++r) {
      WC_ENFORCE_LE(offset[r] + bytes, blocks[r].size(), "block of tp rank ", r, " too short at ",
                    param.name);
      shards[r] = blocks[r].subspan(offset[r], bytes);
      offset[r] += bytes;
    }
    WC_ENFORCE_LE(next + param.parts.size(), out.size(), "HF tensors for ", param.name);
    write_hf(param, shards, out.subspan(next, param.parts.size()));
    next += param.parts.size();
  }
  WC_ENFORCE_EQ(next, out.size(), "HF tensors left unwritten");
  for (std::size_t r = 0; r < blocks.size(); ++r) {
    WC_ENFORCE_EQ(offset[r], blocks[r].size(), "block of tp rank ", r, " too long");
  }
}

std::vector<HostTensor> assemble_hf(const std::vector<MegatronParam>& params,
                                    std::span<const std::span<const std::byte>> blocks) {
  std::vector<HostTensor> out = allocate_hf(params);
  assemble_hf_into(params, blocks, out);
  return out;
}

}  // namespace weightcast::sync::trainer

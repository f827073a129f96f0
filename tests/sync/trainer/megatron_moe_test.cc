// Megatron -> HF for mixtures of experts and MLA: the name mapping of both expert layouts at EP 1,
// 2 and 4 against hand-written expectations (global expert = ep_rank * local count + local
// index), and the gather-and-convert round trip: every EP rank's TP shards give back exactly the
// generator's HF tensors.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/megatron.h"

namespace weightcast::sync::trainer {
namespace {

using Names = std::vector<std::string>;

struct Row {
  const char* preset;
  int pp, stage, ep;
  ExpertLayout layout;
  int ep_rank;  // -1: a dense param, held by every EP rank
  const char* megatron;
  TpSplit split;
  Names hf;
};

constexpr auto kLocal = ExpertLayout::kLocalExperts;
constexpr auto kGrouped = ExpertLayout::kGroupedGemm;

// moe-tiny: 2 layers of 8 experts; moe-small: 4 layers of 16 experts and a Qwen-style shared
// expert; deepseek-tiny: 3 layers, MLA, layer 0 dense, then 8 experts and a shared expert.
const std::vector<Row> kTable = {
    // EP 1: every expert on EP rank 0, local index = global index.
    {"moe-tiny",
     1,
     0,
     1,
     kLocal,
     0,
     "decoder.layers.1.mlp.experts.local_experts.5.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.1.mlp.experts.5.gate_proj.weight",
      "model.layers.1.mlp.experts.5.up_proj.weight"}},
    {"moe-tiny",
     1,
     0,
     1,
     kGrouped,
     0,
     "decoder.layers.0.mlp.experts.linear_fc2.weight7",
     TpSplit::kDim1,
     {"model.layers.0.mlp.experts.7.down_proj.weight"}},
    // EP 2: 4 experts per rank; expert 5 is rank 1's local 1, expert 3 rank 0's local 3.
    {"moe-tiny",
     1,
     0,
     2,
     kLocal,
     1,
     "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.1.mlp.experts.5.gate_proj.weight",
      "model.layers.1.mlp.experts.5.up_proj.weight"}},
    {"moe-tiny",
     1,
     0,
     2,
     kGrouped,
     0,
     "decoder.layers.0.mlp.experts.linear_fc2.weight3",
     TpSplit::kDim1,
     {"model.layers.0.mlp.experts.3.down_proj.weight"}},
    {"moe-tiny",
     1,
     0,
     2,
     kGrouped,
     1,
     "decoder.layers.0.mlp.experts.linear_fc1.weight0",
     TpSplit::kFusedDim0,
     {"model.layers.0.mlp.experts.4.gate_proj.weight",
      "model.layers.0.mlp.experts.4.up_proj.weight"}},
    // EP 4: 2 experts per rank.
    {"moe-tiny",
     1,
     0,
     4,
     kLocal,
     2,
     "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight",
     TpSplit::kDim1,
     {"model.layers.1.mlp.experts.5.down_proj.weight"}},
    {"moe-tiny",
     1,
     0,
     4,
     kGrouped,
     3,
     "decoder.layers.0.mlp.experts.linear_fc1.weight1",
     TpSplit::kFusedDim0,
     {"model.layers.0.mlp.experts.7.gate_proj.weight",
      "model.layers.0.mlp.experts.7.up_proj.weight"}},
    {"moe-tiny",
     1,
     0,
     4,
     kLocal,
     0,
     "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.0.mlp.experts.0.gate_proj.weight",
      "model.layers.0.mlp.experts.0.up_proj.weight"}},
    // With PP 2, stage 1's local layer 0 is model layer 1.
    {"moe-tiny",
     2,
     1,
     2,
     kLocal,
     1,
     "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.1.mlp.experts.7.gate_proj.weight",
      "model.layers.1.mlp.experts.7.up_proj.weight"}},
    {"moe-tiny",
     2,
     1,
     4,
     kGrouped,
     1,
     "decoder.layers.0.mlp.experts.linear_fc2.weight0",
     TpSplit::kDim1,
     {"model.layers.1.mlp.experts.2.down_proj.weight"}},
    // The router and the MoE layer's MLP norm, on every EP rank.
    {"moe-tiny",
     1,
     0,
     4,
     kLocal,
     -1,
     "decoder.layers.1.mlp.router.weight",
     TpSplit::kReplicated,
     {"model.layers.1.mlp.gate.weight"}},
    {"moe-tiny",
     1,
     0,
     2,
     kGrouped,
     -1,
     "decoder.layers.0.pre_mlp_layernorm.weight",
     TpSplit::kReplicated,
     {"model.layers.0.post_attention_layernorm.weight"}},
    {"moe-tiny",
     1,
     0,
     2,
     kGrouped,
     -1,
     "decoder.layers.0.self_attention.linear_qkv.weight",
     TpSplit::kFusedDim0,
     {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight"}},
    // Qwen-style shared expert and its gate; experts of a 16-expert model at EP 4.
    {"moe-small",
     1,
     0,
     4,
     kLocal,
     -1,
     "decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.2.mlp.shared_expert.gate_proj.weight",
      "model.layers.2.mlp.shared_expert.up_proj.weight"}},
    {"moe-small",
     1,
     0,
     4,
     kLocal,
     -1,
     "decoder.layers.2.mlp.shared_experts.linear_fc2.weight",
     TpSplit::kDim1,
     {"model.layers.2.mlp.shared_expert.down_proj.weight"}},
    {"moe-small",
     1,
     0,
     4,
     kLocal,
     -1,
     "decoder.layers.3.mlp.shared_experts.gate_weight",
     TpSplit::kReplicated,
     {"model.layers.3.mlp.shared_expert_gate.weight"}},
    {"moe-small",
     1,
     0,
     4,
     kGrouped,
     3,
     "decoder.layers.3.mlp.experts.linear_fc2.weight2",
     TpSplit::kDim1,
     {"model.layers.3.mlp.experts.14.down_proj.weight"}},
    {"moe-small",
     2,
     1,
     2,
     kLocal,
     1,
     "decoder.layers.1.mlp.experts.local_experts.7.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.3.mlp.experts.15.gate_proj.weight",
      "model.layers.3.mlp.experts.15.up_proj.weight"}},
    // DeepSeek style: a dense first layer, MLA attention, plural shared experts.
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.0.mlp.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
     TpSplit::kReplicated,
     {"model.layers.0.post_attention_layernorm.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.1.input_layernorm.weight",
     TpSplit::kReplicated,
     {"model.layers.1.input_layernorm.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.1.self_attention.linear_q_down_proj.weight",
     TpSplit::kReplicated,
     {"model.layers.1.self_attn.q_a_proj.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.1.self_attention.linear_kv_down_proj.weight",
     TpSplit::kReplicated,
     {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.2.self_attention.linear_q_up_proj.layer_norm_weight",
     TpSplit::kReplicated,
     {"model.layers.2.self_attn.q_a_layernorm.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.2.self_attention.linear_q_up_proj.weight",
     TpSplit::kDim0,
     {"model.layers.2.self_attn.q_b_proj.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight",
     TpSplit::kReplicated,
     {"model.layers.0.self_attn.kv_a_layernorm.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.0.self_attention.linear_kv_up_proj.weight",
     TpSplit::kDim0,
     {"model.layers.0.self_attn.kv_b_proj.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.1.self_attention.linear_proj.weight",
     TpSplit::kDim1,
     {"model.layers.1.self_attn.o_proj.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.1.pre_mlp_layernorm.weight",
     TpSplit::kReplicated,
     {"model.layers.1.post_attention_layernorm.weight"}},
    {"deepseek-tiny",
     1,
     0,
     2,
     kLocal,
     -1,
     "decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
     TpSplit::kFusedDim0,
     {"model.layers.2.mlp.shared_experts.gate_proj.weight",
      "model.layers.2.mlp.shared_experts.up_proj.weight"}},
    {"deepseek-tiny",
     3,
     2,
     4,
     kGrouped,
     3,
     "decoder.layers.0.mlp.experts.linear_fc1.weight1",
     TpSplit::kFusedDim0,
     {"model.layers.2.mlp.experts.7.gate_proj.weight",
      "model.layers.2.mlp.experts.7.up_proj.weight"}},
};

const MegatronParam* find(const std::vector<MegatronParam>& params, const std::string& name,
                          int ep_rank) {
  for (const auto& p : params) {
    if (p.name == name && p.ep_rank == ep_rank) return &p;
  }
  return nullptr;
}

TEST(MegatronMoe, ExpertAndMlaNamesMatchTheTable) {
  for (const Row& row : kTable) {
    SCOPED_TRACE(std::string(row.preset) + " ep " + std::to_string(row.ep) + " " +
                 std::string(to_string(row.layout)) + " " + row.megatron);
    const ModelSpec spec = model_preset(row.preset);
    const ExpertParallel experts{row.ep, row.layout};
    const auto params = stage_params(spec, row.stage, row.pp, experts);
    const MegatronParam* p = find(params, row.megatron, row.ep_rank);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->split, row.split);
    Names got;
    for (const auto& part : p->parts) got.push_back(part.name);
    EXPECT_EQ(got, row.hf);
    // The lookup an EP rank runs on its own parameters agrees.
    const int as_rank = row.ep_rank < 0 ? row.ep - 1 : row.ep_rank;
    EXPECT_EQ(hf_names(spec, row.stage, row.pp, experts, as_rank, row.megatron), row.hf);
  }
}

TEST(MegatronMoe, EachEpRankHoldsItsContiguousExperts) {
  const ModelSpec spec = model_preset("moe-tiny");
  for (int ep : {1, 2, 4}) {
    for (ExpertLayout layout : {kLocal, kGrouped}) {
      const auto params = stage_params(spec, 0, 1, {ep, layout});
      std::map<int, std::set<std::string>> experts_of;  // ep rank -> "layer.expert"
      for (const auto& p : params) {
        if (p.ep_rank < 0) {
          for (const auto& part : p.parts) {
            EXPECT_EQ(part.name.find("mlp.experts."), std::string::npos) << part.name;
          }
          continue;
        }
        for (const auto& part : p.parts) {
          const auto at = part.name.find("mlp.experts.") + 12;
          const int e = std::stoi(part.name.substr(at));
          EXPECT_EQ(e / (8 / ep), p.ep_rank) << part.name << " at ep " << ep;
          experts_of[p.ep_rank].insert(part.name.substr(13, 1) + "." + std::to_string(e));
        }
      }
      ASSERT_EQ(experts_of.size(), static_cast<std::size_t>(ep));
      // 2 layers x 8 / ep experts each.
      for (const auto& [rank, set] : experts_of) EXPECT_EQ(set.size(), 16u / ep) << rank;
    }
  }
}

std::vector<std::byte> generated(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step) {
  std::vector<std::byte> bytes(meta.byte_count());
  fill_tensor(meta, seed, step, bytes);
  return bytes;
}

TEST(MegatronMoe, EveryEpRanksShardsConvertBackToTheGeneratorsTensors) {
  for (const char* preset : {"moe-tiny", "deepseek-tiny"}) {
    ModelSpec spec = model_preset(preset);
    spec.mtp_num_layers = std::string(preset) == "deepseek-tiny" ? 1 : 0;
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (int ep : {1, 2, 4}) {
          for (ExpertLayout layout : {kLocal, kGrouped}) {
            SCOPED_TRACE(std::string(preset) + " tp " + std::to_string(tp) + " pp " +
                         std::to_string(pp) + " ep " + std::to_string(ep));
            Names all;
            for (int stage = 0; stage < pp; ++stage) {
              const auto params = stage_params(spec, stage, pp, {ep, layout});
              check_tp_divisible(params, tp);
              std::vector<std::vector<std::byte>> blocks;  // [tp_rank + tp * ep_rank]
              for (int e = 0; e < ep; ++e) {
                for (int r = 0; r < tp; ++r) {
                  blocks.push_back(rank_shards(params, tp, r, 9, 2, e));
                }
              }
              std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
              for (const auto& t : assemble_hf(params, spans, tp)) {
                ASSERT_EQ(t.bytes, generated(t.meta, 9, 2)) << t.meta.name;
                all.push_back(t.meta.name);
              }
            }
            Names expected;
            for (const auto& m : hf_tensors(spec)) expected.push_back(m.name);
            EXPECT_EQ(all, expected);
          }
        }
      }
    }
  }
}

TEST(MegatronMoe, ExpertRanksSendOnlyTheirExperts) {
  const auto params = stage_params(model_preset("moe-tiny"), 0, 1, {2, kLocal});
  std::size_t dense = 0, experts = 0;
  for (const auto& p : params) (p.ep_rank < 0 ? dense : experts) += p.byte_count();
  // tp 1: EP rank 0 sends the dense params and half the experts, EP rank 1 the other half.
  EXPECT_EQ(rank_shards(params, 1, 0, 1, 1, 0).size(), dense + experts / 2);
  EXPECT_EQ(rank_shards(params, 1, 0, 1, 1, 1).size(), experts / 2);
}

TEST(MegatronMoe, BadExpertParallelismIsAConfigError) {
  const ModelSpec moe = model_preset("moe-tiny");
  EXPECT_THROW(stage_params(moe, 0, 1, {3, kLocal}), comm::ConfigError);  // 8 experts
  EXPECT_THROW(stage_params(model_preset("tiny"), 0, 1, {2, kLocal}), comm::ConfigError);
  EXPECT_THROW(hf_names(moe, 0, 1, {2, kLocal}, 0,
                        "decoder.layers.0.mlp.experts.local_experts.4.linear_fc1.weight"),
               comm::ConfigError);  // rank 0 holds local experts 0..3
  EXPECT_THROW(parse_expert_layout("packed"), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer

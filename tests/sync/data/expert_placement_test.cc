// Expert placement: the experts an engine rank with expert parallelism holds, as SGLang and vLLM
// place them, and the name predicate that keeps them. Tables written by hand.
#include "sync/model/expert_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/model.h"
#include "sync/model/name_filter.h"

namespace weightcast::sync {
namespace {

TEST(ExpertPlacement, ParsesExpertNamesOfEveryFamily) {
  struct Row {
    const char* name;
    std::optional<ExpertRef> want;
  };
  const std::vector<Row> rows = {
      // Qwen3-MoE / Qwen2-MoE
      {"model.layers.3.mlp.experts.17.gate_proj.weight", ExpertRef{3, 17}},
      {"model.layers.0.mlp.experts.0.up_proj.weight", ExpertRef{0, 0}},
      {"model.layers.47.mlp.experts.127.down_proj.weight", ExpertRef{47, 127}},
      {"model.layers.3.mlp.gate.weight", std::nullopt},  // router
      {"model.layers.3.mlp.shared_expert.gate_proj.weight", std::nullopt},
      {"model.layers.3.mlp.shared_expert_gate.weight", std::nullopt},
      {"model.layers.3.mlp.gate_proj.weight", std::nullopt},  // dense MLP
      // DeepSeek-V2/V3 (fp8 scales and the MTP layer too)
      {"model.layers.5.mlp.experts.255.down_proj.weight", ExpertRef{5, 255}},
      {"model.layers.5.mlp.experts.255.down_proj.weight_scale_inv", ExpertRef{5, 255}},
      {"model.layers.61.mlp.experts.9.gate_proj.weight", ExpertRef{61, 9}},
      {"model.layers.5.mlp.shared_experts.gate_proj.weight", std::nullopt},
      {"model.layers.5.mlp.gate.e_score_correction_bias", std::nullopt},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", std::nullopt},
      // Mixtral
      {"model.layers.2.block_sparse_moe.experts.7.w1.weight", ExpertRef{2, 7}},
      {"model.layers.2.block_sparse_moe.gate.weight", std::nullopt},
      // Not per-expert: stacked experts, no tensor name after the index, malformed indices
      {"model.layers.1.mlp.experts.gate_up_proj", std::nullopt},
      {"model.layers.1.mlp.experts.3", std::nullopt},
      {"model.layers.1.mlp.experts.03.up_proj.weight", std::nullopt},
      {"model.layers.1.mlp.experts.-1.up_proj.weight", std::nullopt},
      {"model.layers.1.mlp.experts.1234567890.up_proj.weight", std::nullopt},
      {"model.layers.1.mlp.my_experts.3.up_proj.weight", std::nullopt},
      {"", std::nullopt},
      // No layer: the expert alone
      {"experts.4.w2.weight", ExpertRef{-1, 4}},
      {"model.layers.x.mlp.experts.4.up_proj.weight", ExpertRef{-1, 4}},
  };
  for (const Row& row : rows) EXPECT_EQ(parse_expert(row.name), row.want) << row.name;
}

TEST(ExpertPlacement, RenamesTheExpertIndexOnly) {
  EXPECT_EQ(with_expert_index("model.layers.3.mlp.experts.3.down_proj.weight", 11),
            "model.layers.3.mlp.experts.11.down_proj.weight");
  EXPECT_EQ(with_expert_index("model.layers.3.mlp.experts.17.up_proj.weight", 0),
            "model.layers.3.mlp.experts.0.up_proj.weight");
  EXPECT_THROW(with_expert_index("model.layers.3.mlp.gate.weight", 1), comm::ConfigError);
  EXPECT_THROW(with_expert_index("model.layers.3.mlp.experts.1.up_proj.weight", -1),
               comm::ConfigError);
}

// rank -> its experts, by hand. Linear: SGLang's blocks (E divisible by n), vLLM's "linear" with
// the remainder on the first ranks; round robin: vLLM's "round_robin".
TEST(ExpertPlacement, LinearAndRoundRobinTables) {
  struct Row {
    int experts, ep;
    PlacementStrategy strategy;
    std::vector<std::vector<int>> held;  // index: EP rank
  };
  const auto L = PlacementStrategy::kLinear;
  const auto R = PlacementStrategy::kRoundRobin;
  const std::vector<Row> rows = {
      {8, 1, L, {{0, 1, 2, 3, 4, 5, 6, 7}}},
      {8, 2, L, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
      {8, 4, L, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
      {8, 8, L, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}},
      {10, 4, L, {{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}},
      {7, 3, L, {{0, 1, 2}, {3, 4}, {5, 6}}},
      {8, 2, R, {{0, 2, 4, 6}, {1, 3, 5, 7}}},
      {10, 4, R, {{0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}}},
      {3, 3, R, {{0}, {1}, {2}}},
  };
  for (const Row& row : rows) {
    ASSERT_EQ(static_cast<int>(row.held.size()), row.ep);
    for (int p = 0; p < row.ep; ++p) {
      const ExpertPlacement place(row.experts, row.ep, p, row.strategy);
      const std::string what = place.describe();
      EXPECT_EQ(place.local_experts(), row.held[static_cast<std::size_t>(p)]) << what;
      EXPECT_EQ(place.num_local(), static_cast<int>(row.held[static_cast<std::size_t>(p)].size()))
          << what;
      for (int e = 0; e < row.experts; ++e) {
        const auto& mine = row.held[static_cast<std::size_t>(p)];
        const auto it = std::find(mine.begin(), mine.end(), e);
        if (it == mine.end()) {
          EXPECT_FALSE(place.holds(e)) << what << " expert " << e;
          EXPECT_NE(place.owner(e), p) << what << " expert " << e;
        } else {
          const int local = static_cast<int>(it - mine.begin());
          EXPECT_EQ(place.local_index(e), local) << what << " expert " << e;
          EXPECT_EQ(place.global_index(local), e) << what;
          EXPECT_EQ(place.owner(e), p) << what << " expert " << e;
        }
      }
    }
  }
}

TEST(ExpertPlacement, LinearMatchesMegatronBlocksWhenDivisible) {
  // Megatron's EP rank p holds [p*E/n, (p+1)*E/n): global = p * E/n + local.
  for (int experts : {8, 16, 64}) {
    for (int ep : {1, 2, 4}) {
      for (int p = 0; p < ep; ++p) {
        const ExpertPlacement place(experts, ep, p);
        ASSERT_EQ(place.num_local(), experts / ep);
        for (int j = 0; j < experts / ep; ++j)
          EXPECT_EQ(place.global_index(j), p * experts / ep + j);
      }
    }
  }
}

TEST(ExpertPlacement, DescribesTheRank) {
  EXPECT_EQ(ExpertPlacement(8, 2, 1).describe(), "experts [4, 8) of 8 (ep 2, rank 1, linear)");
  EXPECT_EQ(ExpertPlacement(16, 2, 1, PlacementStrategy::kRoundRobin).describe(),
            "experts {1, 3, 5, 7, ...} of 16 (ep 2, rank 1, round_robin)");
}

TEST(ExpertPlacement, RefusesBadConfigurations) {
  EXPECT_THROW(ExpertPlacement(0, 1, 0), comm::ConfigError);
  EXPECT_THROW(ExpertPlacement(8, 0, 0), comm::ConfigError);
  EXPECT_THROW(ExpertPlacement(8, 9, 0), comm::ConfigError);
  EXPECT_THROW(ExpertPlacement(8, 2, 2), comm::ConfigError);
  EXPECT_THROW(ExpertPlacement(8, 2, -1), comm::ConfigError);
  const ExpertPlacement place(8, 2, 0);
  EXPECT_THROW(place.global_index(4), comm::ConfigError);
  EXPECT_THROW(place.owner(8), comm::ConfigError);
  EXPECT_FALSE(place.local_index(-1).has_value());
  EXPECT_FALSE(place.local_index(8).has_value());
  EXPECT_EQ(parse_placement_strategy("linear"), PlacementStrategy::kLinear);
  EXPECT_EQ(parse_placement_strategy("round_robin"), PlacementStrategy::kRoundRobin);
  EXPECT_THROW(parse_placement_strategy("random"), comm::ConfigError);
}

TEST(ExpertPlacement, EpRankOfTpRankAsSglang) {
  // tp 8, ep 4: TP ranks {0,1} -> EP 0, {2,3} -> 1, ...; ep == tp: one to one; ep 1: all EP 0.
  const std::vector<int> want = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(ep_rank_of_tp_rank(r, 8, 4), want[static_cast<std::size_t>(r)]) << r;
    EXPECT_EQ(ep_rank_of_tp_rank(r, 8, 8), r);
    EXPECT_EQ(ep_rank_of_tp_rank(r, 8, 1), 0);
  }
  EXPECT_THROW(ep_rank_of_tp_rank(0, 6, 4), comm::ConfigError);
  EXPECT_THROW(ep_rank_of_tp_rank(6, 6, 3), comm::ConfigError);
  EXPECT_THROW(ep_rank_of_tp_rank(0, 4, 0), comm::ConfigError);
}

TEST(ExpertPlacement, AcceptsDenseTensorsAndOnlyLocalExperts) {
  const ExpertPlacement rank1(8, 2, 1);
  EXPECT_TRUE(rank1.accepts("model.embed_tokens.weight"));
  EXPECT_TRUE(rank1.accepts("model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(rank1.accepts("model.layers.0.mlp.shared_expert.up_proj.weight"));
  EXPECT_TRUE(rank1.accepts("model.layers.0.mlp.shared_experts.down_proj.weight"));
  EXPECT_TRUE(rank1.accepts("model.layers.0.mlp.experts.4.gate_proj.weight"));
  EXPECT_TRUE(rank1.accepts("model.layers.9.mlp.experts.7.down_proj.weight"));
  EXPECT_FALSE(rank1.accepts("model.layers.0.mlp.experts.3.gate_proj.weight"));
  EXPECT_FALSE(rank1.accepts("model.layers.0.mlp.experts.8.gate_proj.weight"));  // beyond E
  // Composed with a runner's NameFilter, as an engine rank would.
  const NameFilter target = NameFilter::parse("model.*,lm_head.weight");
  const auto loads = [&](const char* name) { return target.accepts(name) && rank1.accepts(name); };
  EXPECT_TRUE(loads("model.layers.0.mlp.experts.5.up_proj.weight"));
  EXPECT_FALSE(loads("model.layers.0.mlp.experts.1.up_proj.weight"));
  EXPECT_FALSE(loads("mtp.layers.0.mlp.experts.5.up_proj.weight"));
}

TEST(ExpertPlacement, EveryExpertTensorOfThePresetsHasExactlyOneRank) {
  // Over the MoE presets' own names: each routed expert's tensors are loaded by exactly one EP
  // rank, every other tensor by all of them, and the ranks' expert bytes add up to the whole.
  for (const char* preset : {"moe-tiny", "moe-small", "deepseek-tiny"}) {
    const ModelSpec spec = model_preset(preset);
    const auto metas = hf_tensors(spec);
    for (const auto strategy : {PlacementStrategy::kLinear, PlacementStrategy::kRoundRobin}) {
      for (int ep : {1, 2, 4}) {
        std::vector<ExpertPlacement> ranks;
        for (int p = 0; p < ep; ++p) {
          ranks.emplace_back(static_cast<int>(spec.num_experts), ep, p, strategy);
        }
        std::size_t expert_tensors = 0;
        std::set<std::pair<int, int>> experts_seen;
        for (const TensorMeta& meta : metas) {
          int takers = 0;
          for (const auto& r : ranks) takers += r.accepts(meta.name) ? 1 : 0;
          if (const auto ref = parse_expert(meta.name)) {
            ++expert_tensors;
            experts_seen.insert({ref->layer, ref->expert});
            EXPECT_EQ(takers, 1) << preset << " ep " << ep << " " << meta.name;
          } else {
            EXPECT_EQ(takers, ep) << preset << " ep " << ep << " " << meta.name;
          }
        }
        std::int64_t moe_layers = 0;
        for (std::int64_t l = 0; l < spec.num_layers + spec.mtp_num_layers; ++l) {
          moe_layers += spec.is_moe_layer(l) ? 1 : 0;
        }
        EXPECT_EQ(static_cast<std::int64_t>(experts_seen.size()), moe_layers * spec.num_experts)
            << preset;
        EXPECT_EQ(expert_tensors, 3 * experts_seen.size()) << preset;
      }
    }
  }
}

}  // namespace
}  // namespace weightcast::sync

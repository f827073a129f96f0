// Megatron TP/PP shards and the raw conversion: gathering every TP rank's shards and converting
// them gives back exactly the generator's HF tensors of the stage, for several TP and PP sizes
// and model shapes.
#include "sync/trainer/megatron.h"

#include <gtest/gtest.h>

#include "comm/errors.h"

namespace weightcast::sync::trainer {
namespace {

ModelSpec tiny() {
  return model_preset("tiny");
}

std::vector<std::byte> generated(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step) {
  std::vector<std::byte> bytes(meta.byte_count());
  fill_tensor(meta, seed, step, bytes);
  return bytes;
}

void expect_round_trip(const ModelSpec& spec, int tp, int pp, std::uint64_t step,
                       const ExpertParallel& experts = {}) {
  SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " ep " +
               std::to_string(experts.ep) + " " + std::string(to_string(experts.layout)));
  std::vector<std::string> all_names;
  for (int stage = 0; stage < pp; ++stage) {
    const auto params = stage_params(spec, stage, pp, experts);
    check_tp_divisible(params, tp);
    std::vector<std::vector<std::byte>> blocks;  // [tp_rank + tp * ep_rank]
    for (int e = 0; e < experts.ep; ++e) {
      for (int r = 0; r < tp; ++r) blocks.push_back(rank_shards(params, tp, r, 42, step, e));
    }
    std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
    const auto tensors = assemble_hf(params, spans, tp);
    const auto expected = stage_hf_tensors(spec, stage, pp);
    ASSERT_EQ(tensors.size(), expected.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      ASSERT_EQ(tensors[i].meta, expected[i]);
      ASSERT_EQ(tensors[i].bytes, generated(expected[i], 42, step)) << expected[i].name;
      all_names.push_back(expected[i].name);
    }
  }
  // The stages together hold every HF tensor once, in HF order.
  std::vector<std::string> hf_names;
  for (const auto& meta : hf_tensors(spec)) hf_names.push_back(meta.name);
  EXPECT_EQ(all_names, hf_names);
}

TEST(Megatron, GatherAndConvertGivesTheGeneratorsHfTensors) {
  ModelSpec with_mtp = tiny();
  with_mtp.mtp_num_layers = 1;
  ModelSpec tied = tiny();
  tied.tie_word_embeddings = true;
  ModelSpec fp32 = tiny();
  fp32.dtype = DType::kFloat32;
  fp32.num_layers = 3;
  for (const ModelSpec& spec : {tiny(), with_mtp, tied, fp32}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) expect_round_trip(spec, tp, pp, 3);
    }
  }
  ModelSpec wide = tiny();  // 8 heads over 4 KV heads, everything divisible by 4
  wide.num_attention_heads = 8;
  wide.num_key_value_heads = 4;
  wide.head_dim = 32;
  expect_round_trip(wide, 4, 2, 1);
}

TEST(Megatron, AssemblingWithDigestsGivesEachWrittenTensorsDigest) {
  const ModelSpec spec = tiny();
  const int tp = 2;
  const auto params = stage_params(spec, 0, 1);
  std::vector<std::vector<std::byte>> blocks;
  for (int r = 0; r < tp; ++r) blocks.push_back(rank_shards(params, tp, r, 42, 2));
  std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
  auto tensors = allocate_hf(params);
  std::vector<Digest> digests(tensors.size());
  assemble_hf_into(params, spans, tp, bytes_of(tensors), digests);
  ASSERT_FALSE(tensors.empty());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(digests[i], tensor_digest(tensors[i].bytes)) << tensors[i].meta.name;
    EXPECT_EQ(tensors[i].bytes, generated(tensors[i].meta, 42, 2)) << tensors[i].meta.name;
  }
  // One digest per tensor, or none.
  std::vector<Digest> short_list(tensors.size() - 1);
  EXPECT_THROW(assemble_hf_into(params, spans, tp, bytes_of(tensors), short_list),
               comm::EnforceError);
}

TEST(Megatron, NamesAreMegatronsWithStageLocalLayers) {
  const auto stage1 = stage_params(tiny(), 1, 2);  // tiny has 2 layers: layer 1 is stage 1's 0
  std::vector<std::string> names;
  for (const auto& p : stage1) names.push_back(p.name);
  EXPECT_EQ(names.front(), "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "output_layer.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "decoder.final_layernorm.weight"), names.end());
  const auto qkv = std::find_if(stage1.begin(), stage1.end(), [](const MegatronParam& p) {
    return p.name == "decoder.layers.0.self_attention.linear_qkv.weight";
  });
  ASSERT_NE(qkv, stage1.end());
  ASSERT_EQ(qkv->parts.size(), 3u);
  EXPECT_EQ(qkv->parts[0].name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(qkv->parts[2].name, "model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(qkv->split, TpSplit::kFusedDim0);
  const auto stage0 = stage_params(tiny(), 0, 2);
  EXPECT_EQ(stage0.front().name, "embedding.word_embeddings.weight");
}

TEST(Megatron, FusedShardIsTheConcatenationOfPartSlices) {
  const ModelSpec spec = tiny();
  const auto params = stage_params(spec, 0, 1);
  const auto& qkv = *std::find_if(params.begin(), params.end(), [](const MegatronParam& p) {
    return p.name == "decoder.layers.0.self_attention.linear_qkv.weight";
  });
  const int tp = 2;
  std::vector<std::byte> shard;
  std::map<std::string, std::vector<std::byte>> full;
  append_shard(
      qkv, tp, 1,
      [&](const TensorMeta& m) -> std::span<const std::byte> {
        return full[m.name] = generated(m, 5, 0);
      },
      shard);
  std::vector<std::byte> expected;
  for (const auto& part : qkv.parts) {
    const auto& bytes = full[part.name];
    expected.insert(expected.end(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2),
                    bytes.end());  // rank 1's rows of q, then of k, then of v
  }
  EXPECT_EQ(shard, expected);
  EXPECT_EQ(shard.size(), shard_bytes(qkv, tp));
}

TEST(Megatron, RowParallelShardTakesColumns) {
  const auto params = stage_params(tiny(), 0, 1);
  const auto& proj = *std::find_if(params.begin(), params.end(), [](const MegatronParam& p) {
    return p.name == "decoder.layers.0.self_attention.linear_proj.weight";
  });
  EXPECT_EQ(proj.split, TpSplit::kDim1);
  const TensorMeta& meta = proj.parts[0];
  const auto full = generated(meta, 5, 0);
  std::vector<std::byte> shard;
  append_shard(
      proj, 2, 0, [&](const TensorMeta&) { return std::span<const std::byte>(full); }, shard);
  const std::size_t row = full.size() / static_cast<std::size_t>(meta.shape[0]);
  for (std::int64_t i = 0; i < meta.shape[0]; ++i) {
    const auto* want = full.data() + static_cast<std::size_t>(i) * row;
    ASSERT_TRUE(
        std::equal(want, want + row / 2, shard.data() + static_cast<std::size_t>(i) * (row / 2)));
  }
}

TEST(Megatron, ReplicatedParamsComeFromTpRankZeroOnly) {
  const auto params = stage_params(tiny(), 0, 1);
  std::size_t rank0 = 0, rank1 = 0;
  for (const auto& p : params) {
    rank0 += shard_bytes(p, 2);
    if (p.split != TpSplit::kReplicated) rank1 += shard_bytes(p, 2);
  }
  EXPECT_EQ(rank_shards(params, 2, 0, 1, 1).size(), rank0);
  EXPECT_EQ(rank_shards(params, 2, 1, 1, 1).size(), rank1);
}

TEST(Megatron, BadSplitsAreConfigErrors) {
  const auto params = stage_params(tiny(), 0, 1);
  try {
    check_tp_divisible(params, 3);
    FAIL() << "tp 3 should not divide tiny's dimensions";
  } catch (const comm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by tp 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(stage_params(tiny(), 0, 3), comm::ConfigError);  // 2 layers, 3 stages
  EXPECT_THROW(stage_params(tiny(), 2, 2), comm::ConfigError);
}

TEST(Megatron, StepsChangeTheWeights) {
  const auto params = stage_params(tiny(), 0, 1);
  EXPECT_NE(rank_shards(params, 1, 0, 7, 1), rank_shards(params, 1, 0, 7, 2));
}

}  // namespace
}  // namespace weightcast::sync::trainer

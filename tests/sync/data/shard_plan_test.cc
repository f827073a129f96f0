// Shard plans (sync/model/shard_plan.h, tensor_parallel_plan.h): the JSON an engine announces,
// the checks a plan must pass before a sender relies on it, the strided slice copy, and the
// hand-written tensor-parallel rules against torch's narrow() as the reference engine applies it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/model.h"
#include "sync/model/shard_plan.h"
#include "sync/model/tensor_parallel_plan.h"

namespace weightcast::sync {
namespace {

std::vector<ShardPlan> engine_plans(const ModelSpec& spec, const std::vector<TensorMeta>& tensors,
                                    int tp, int ep = 1) {
  std::vector<ShardPlan> plans;
  for (int r = 0; r < tp; ++r) plans.push_back(tensor_parallel_plan(spec, tensors, {tp, r, ep}));
  return plans;
}

// The message of the BadRequestError `fn` throws ("" when it throws none).
template <typename Fn>
std::string refusal(Fn&& fn) {
  try {
    fn();
  } catch (const comm::BadRequestError& e) {
    return e.what();
  }
  return "";
}

// Bytes 0, 1, 2, ... of a tensor (wrapping at 256 is fine: positions differ by dtype element).
std::vector<std::byte> numbered(const TensorMeta& meta) {
  std::vector<std::byte> out(meta.byte_count());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 7 + i / 251);
  return out;
}

TEST(ShardPlan, JsonRoundTripsAndRefusesMalformedEntriesNamingTheTensor) {
  ShardPlan plan;
  plan.tensors["a.weight"] = TensorSlice::slice(1, 64, 32);
  plan.tensors["b.weight"] = TensorSlice::replicated();
  plan.tensors["c.weight"] = TensorSlice::absent();
  const nlohmann::json j = to_json(plan);
  EXPECT_EQ(j.dump(),
            R"({"tensors":{"a.weight":{"dim":1,"length":32,"offset":64},"b.weight":"replicated",)"
            R"("c.weight":"absent"}})");
  EXPECT_EQ(shard_plan_from_json(j), plan);

  auto refused = [](const char* text) {
    return refusal([&] { shard_plan_from_json(nlohmann::json::parse(text)); });
  };
  EXPECT_NE(refused(R"({"tensors":{"w":"sharded"}})").find("tensor 'w'"), std::string::npos);
  EXPECT_NE(refused(R"({"tensors":{"w":{"dim":0,"offset":0}}})").find("'length'"),
            std::string::npos);
  EXPECT_NE(refused(R"({"tensors":{"w":{"dim":0,"offset":-1,"length":2}}})").find("offset"),
            std::string::npos);
  EXPECT_NE(refused(R"({"tensors":{"w":{"dim":0,"offset":0,"length":0}}})").find("length"),
            std::string::npos);
  EXPECT_NE(refused(R"({"tensors":{"w":{"dim":1.5,"offset":0,"length":1}}})").find("'dim'"),
            std::string::npos);
  EXPECT_NE(refused(R"({"tensors":{"w":7}})").find("tensor 'w'"), std::string::npos);
  EXPECT_NE(refused(R"([1])").find("'tensors'"), std::string::npos);
}

TEST(ShardPlan, PackCopiesTorchsNarrowAndUnpackPutsItBack) {
  const TensorMeta meta{"w", DType::kBFloat16, {3, 8, 5}};
  const auto full = numbered(meta);
  const std::size_t e = 2;
  for (int dim = 0; dim < 3; ++dim) {
    const std::int64_t size = meta.shape[static_cast<std::size_t>(dim)];
    const TensorSlice s = TensorSlice::slice(dim, 1, size - 2);
    std::vector<std::byte> part(sliced_bytes(meta, s));
    pack_slice(meta, s, full, part);
    // The reference: element by element, as narrow(dim, 1, size - 2).contiguous() orders them.
    std::vector<std::byte> expect;
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 0; j < 8; ++j) {
        for (std::int64_t k = 0; k < 5; ++k) {
          const std::int64_t at[3] = {i, j, k};
          if (at[dim] < 1 || at[dim] >= size - 1) continue;
          const std::size_t off = static_cast<std::size_t>((i * 8 + j) * 5 + k) * e;
          expect.insert(expect.end(), full.begin() + off, full.begin() + off + e);
        }
      }
    }
    EXPECT_EQ(part, expect) << "dim " << dim;
    std::vector<std::byte> back(full.size(), std::byte{0xEE});
    unpack_slice(meta, s, part, back);
    std::vector<std::byte> again(part.size());
    pack_slice(meta, s, back, again);
    EXPECT_EQ(again, part) << "dim " << dim;
  }
  std::vector<std::byte> wrong(7);
  EXPECT_THROW(pack_slice(meta, TensorSlice::slice(0, 0, 1), full, wrong), comm::EnforceError);
}

TEST(ShardPlan, TensorParallelPlansValidateAndTheirSlicesRebuildEveryTensor) {
  for (const char* preset : {"tiny", "small", "qwen3-0.6b", "moe-tiny", "deepseek-tiny"}) {
    const ModelSpec spec = model_preset(preset);
    const auto tensors = hf_tensors(spec);
    for (int tp : {1, 2, 4}) {
      for (int ep : {1, 2}) {
        if (ep > 1 && (!spec.is_moe() || tp % ep != 0)) continue;
        SCOPED_TRACE(std::string(preset) + " tp " + std::to_string(tp) + " ep " +
                     std::to_string(ep));
        const auto plans = engine_plans(spec, tensors, tp, ep);
        EXPECT_NO_THROW(validate_shard_plans(tensors, plans));
        if (std::string(preset) != "tiny") continue;
        // The ranks' slices put together give back every byte of every tensor.
        for (const auto& meta : tensors) {
          const auto full = numbered(meta);
          std::vector<std::byte> rebuilt(full.size());
          for (const auto& plan : plans) {
            const TensorSlice& s = *plan.find(meta.name);
            std::vector<std::byte> part(sliced_bytes(meta, s));
            pack_slice(meta, s, full, part);
            unpack_slice(meta, s, part, rebuilt);
          }
          EXPECT_EQ(rebuilt, full) << meta.name;
        }
      }
    }
  }
}

TEST(ShardPlan, RulesFollowTheEnginesLoaders) {
  const ModelSpec spec = model_preset("tiny");  // 4 heads, 2 KV heads of 64, ff 512, vocab 1024
  const auto tensors = hf_tensors(spec);
  const auto r1 = tensor_parallel_plan(spec, tensors, {2, 1});
  EXPECT_EQ(*r1.find("model.embed_tokens.weight"), TensorSlice::slice(0, 512, 512));
  EXPECT_EQ(*r1.find("model.layers.0.self_attn.q_proj.weight"), TensorSlice::slice(0, 128, 128));
  EXPECT_EQ(*r1.find("model.layers.0.self_attn.k_proj.weight"), TensorSlice::slice(0, 64, 64));
  EXPECT_EQ(*r1.find("model.layers.0.self_attn.o_proj.weight"), TensorSlice::slice(1, 128, 128));
  EXPECT_EQ(*r1.find("model.layers.1.mlp.gate_proj.weight"), TensorSlice::slice(0, 256, 256));
  EXPECT_EQ(*r1.find("model.layers.1.mlp.down_proj.weight"), TensorSlice::slice(1, 256, 256));
  EXPECT_EQ(*r1.find("model.layers.1.input_layernorm.weight"), TensorSlice::replicated());
  // TP 4 over 2 KV heads: ranks 0-1 share head 0, ranks 2-3 head 1.
  for (int r = 0; r < 4; ++r) {
    const auto plan = tensor_parallel_plan(spec, tensors, {4, r});
    EXPECT_EQ(*plan.find("model.layers.0.self_attn.v_proj.weight"),
              TensorSlice::slice(0, (r / 2) * 64, 64))
        << r;
  }
  const auto draft = draft_tensors(spec);
  for (const auto& [name, s] : tensor_parallel_plan(spec, draft, {4, 3}).tensors) {
    EXPECT_EQ(s, TensorSlice::replicated()) << name;
  }
  // Sizes that do not split are refused, naming the tensor.
  try {
    tensor_parallel_plan(spec, tensors, {3, 0});
    ADD_FAILURE() << "tp 3 of 4 heads";
  } catch (const comm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '"), std::string::npos) << e.what();
  }
}

TEST(ShardPlan, ExpertParallelRanksHoldTheirExpertsAndNoOthers) {
  const ModelSpec spec = model_preset("moe-tiny");  // 8 experts
  const auto tensors = hf_tensors(spec);
  const auto plans = engine_plans(spec, tensors, 4, 2);
  const std::string up = "model.layers.1.mlp.experts.5.up_proj.weight";
  EXPECT_EQ(plans[0].find(up)->kind, TensorSlice::Kind::kAbsent);
  EXPECT_EQ(plans[1].find(up)->kind, TensorSlice::Kind::kAbsent);
  // EP rank 1 (TP ranks 2, 3) holds experts 4-7, each split over its two TP ranks.
  EXPECT_EQ(plans[2].find(up)->kind, TensorSlice::Kind::kSlice);
  EXPECT_NE(*plans[2].find(up), *plans[3].find(up));
  EXPECT_EQ(*plans[3].find("model.layers.1.mlp.gate.weight"), TensorSlice::replicated());
}

TEST(ShardPlan, ValidationNamesTheTensorAPlanGetsWrong) {
  const ModelSpec spec = model_preset("tiny");
  const auto tensors = hf_tensors(spec);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto refused = [&](auto edit) {
    auto plans = engine_plans(spec, tensors, 2);
    edit(plans);
    return refusal([&] { validate_shard_plans(tensors, plans); });
  };
  EXPECT_EQ(refused([](auto&) {}), "");
  std::string why = refused([&](auto& p) { p[1].tensors.erase(q); });
  EXPECT_NE(why.find("tensor '" + q + "': rank 1's plan does not cover it"), std::string::npos)
      << why;
  why = refused([&](auto& p) { p[1].tensors[q] = TensorSlice::slice(0, 100, 128); });
  EXPECT_NE(why.find("'" + q + "': slices overlap"), std::string::npos) << why;
  why = refused([&](auto& p) { p[1].tensors[q] = TensorSlice::slice(0, 129, 127); });
  EXPECT_NE(why.find("'" + q + "': dim 0 [128, 129) is kept by no rank"), std::string::npos) << why;
  why = refused([&](auto& p) { p[0].tensors[q] = TensorSlice::replicated(); });
  EXPECT_NE(why.find("replicate it and others slice it"), std::string::npos) << why;
  why = refused([&](auto& p) { p[0].tensors[q] = TensorSlice::slice(1, 0, 128); });
  EXPECT_NE(why.find("slices dim"), std::string::npos) << why;
  why = refused([&](auto& p) { p[0].tensors[q] = p[1].tensors[q] = TensorSlice::absent(); });
  EXPECT_NE(why.find("no rank keeps it"), std::string::npos) << why;
  why = refused([&](auto& p) { p[0].tensors[q] = TensorSlice::slice(0, 200, 128); });
  EXPECT_NE(why.find("outside dim 0 of size 256"), std::string::npos) << why;
  why = refused([&](auto& p) { p[0].tensors["model.extra.weight"] = TensorSlice::replicated(); });
  EXPECT_NE(why.find("not a tensor of the model"), std::string::npos) << why;
}

TEST(ShardPlan, ClassKeysGroupRanksThatHoldTheSameBytes) {
  const ModelSpec spec = model_preset("tiny");
  const auto tensors = hf_tensors(spec);
  const auto tp2 = engine_plans(spec, tensors, 2);
  const auto tp2_again = engine_plans(spec, tensors, 2);
  const auto tp4 = engine_plans(spec, tensors, 4);
  std::set<std::string> keys;
  for (const auto& p : tp2) keys.insert(p.class_key());
  for (const auto& p : tp4) keys.insert(p.class_key());
  EXPECT_EQ(keys.size(), 6u) << "TP-2 and TP-4 ranks are six different classes";
  EXPECT_EQ(tp2[1].class_key(), tp2_again[1].class_key());
  EXPECT_EQ(tp2[0].class_key().size(), 16u);
}

TEST(ShardPlan, EachTp4RankOfQwen3_8bKeepsAQuarterOfTheShardedBytes) {
  const ModelSpec spec = model_preset("qwen3-8b");  // 8 KV heads: no replication at TP 4
  const auto tensors = hf_tensors(spec);
  const auto plans = engine_plans(spec, tensors, 4);
  std::size_t sharded = 0, replicated = 0;
  for (const auto& meta : tensors) {
    (plans[0].find(meta.name)->kind == TensorSlice::Kind::kReplicated ? replicated : sharded) +=
        meta.byte_count();
  }
  for (const auto& plan : plans) {
    std::size_t kept = 0;
    for (const auto& meta : tensors) kept += sliced_bytes(meta, *plan.find(meta.name));
    EXPECT_EQ(kept, sharded / 4 + replicated);
  }
  EXPECT_LT(replicated * 1000, sharded) << "norms are under 0.1% of the model";
}

}  // namespace
}  // namespace weightcast::sync

// Atomic groups: which tensors travel together (from the model's naming, not the bucket size),
// and plan_buckets() never cutting one; a bucket too small for a group is a ConfigError naming it.
#include "sync/model/atomic_groups.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/bucket.h"
#include "sync/model/model.h"

namespace weightcast::sync {
namespace {

// Bucket index of every tensor in `plans`.
std::map<std::string, std::size_t> bucket_of(const std::vector<BucketPlan>& plans) {
  std::map<std::string, std::size_t> out;
  for (std::size_t b = 0; b < plans.size(); ++b) {
    for (const auto& e : plans[b].entries) out[e.meta.name] = b;
  }
  return out;
}

bool splits(const std::vector<BucketPlan>& plans, const std::string& a, const std::string& b) {
  const auto where = bucket_of(plans);
  return where.at(a) != where.at(b);
}

std::vector<std::string> group_names(const std::vector<AtomicGroup>& groups) {
  std::vector<std::string> out;
  for (const auto& g : groups) out.push_back(g.name);
  return out;
}

TEST(AtomicGroups, FromTheModelsNaming) {
  const ModelSpec spec = model_preset("deepseek-tiny");
  const auto metas = hf_tensors(spec);
  const auto groups = atomic_groups(metas, group_rule(spec));
  const auto names = group_names(groups);
  const auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  EXPECT_TRUE(has("model.layers.1.self_attn.{q_a_proj,kv_a_proj_with_mqa}"));
  EXPECT_TRUE(has("model.layers.0.mlp.{gate,up}_proj"));
  EXPECT_TRUE(has("model.layers.2.mlp.experts.7.{gate,up}_proj"));
  EXPECT_TRUE(has("model.layers.2.mlp.shared_experts.{gate,up}_proj"));
  EXPECT_FALSE(has("model.layers.2.mlp.experts.7.*"));  // whole experts only on request
  for (const auto& g : groups) {
    EXPECT_EQ(g.end - g.first, 2u) << g.name;  // members adjacent in the model's order
    EXPECT_EQ(g.bytes, metas[g.first].byte_count() + metas[g.first + 1].byte_count()) << g.name;
  }
  // A GQA model fuses q/k/v; an expert's three matrices travel together when asked.
  const ModelSpec moe = model_preset("moe-tiny");
  GroupRule whole = group_rule(moe);
  EXPECT_FALSE(whole.mla_down);
  whole.whole_expert = true;
  const auto moe_metas = hf_tensors(moe);
  const auto moe_groups = atomic_groups(moe_metas, whole);
  const auto moe_names = group_names(moe_groups);
  EXPECT_NE(std::find(moe_names.begin(), moe_names.end(), "model.layers.0.self_attn.{q,k,v}_proj"),
            moe_names.end());
  const auto expert =
      std::find(moe_names.begin(), moe_names.end(), "model.layers.1.mlp.experts.3.*");
  ASSERT_NE(expert, moe_names.end());
  const AtomicGroup& g = moe_groups[static_cast<std::size_t>(expert - moe_names.begin())];
  EXPECT_EQ(g.end - g.first, 3u);
  EXPECT_EQ(moe_metas[g.end - 1].name, "model.layers.1.mlp.experts.3.down_proj.weight");
}

// The case: a bucket size that, without the rule, ends a bucket between MLA's q_a and
// kv_a down projections. With the rule every bucket holds whole groups and stays within the size.
TEST(AtomicGroups, MlaPairsNeverSplitAcrossBuckets) {
  const ModelSpec spec = model_preset("deepseek-tiny");
  const auto metas = hf_tensors(spec);
  const auto groups = atomic_groups(metas, group_rule(spec));
  std::size_t largest = 0;
  for (const auto& g : groups) largest = std::max(largest, g.bytes + kDefaultBucketAlignment);
  std::size_t cutting = 0;  // a bucket size that cuts an MLA pair without groups
  std::string cut_layer;
  for (std::size_t size = largest; size < largest * 4 && cutting == 0; size += 256) {
    const auto plain = plan_buckets(metas, size);
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
      if (splits(plain, p + "q_a_proj.weight", p + "kv_a_proj_with_mqa.weight")) {
        cutting = size;
        cut_layer = p;
        break;
      }
    }
  }
  ASSERT_NE(cutting, 0u) << "no bucket size cuts an MLA pair: the test would prove nothing";
  const auto grouped = plan_buckets(metas, cutting, kDefaultBucketAlignment, groups);
  EXPECT_FALSE(
      splits(grouped, cut_layer + "q_a_proj.weight", cut_layer + "kv_a_proj_with_mqa.weight"));
  const auto where = bucket_of(grouped);
  for (const auto& g : groups) {
    for (std::size_t i = g.first; i < g.end; ++i) {
      EXPECT_EQ(where.at(metas[i].name), where.at(metas[g.first].name)) << g.name;
    }
  }
  for (const auto& plan : grouped) EXPECT_LE(plan.total_bytes, cutting);
  // Same tensors, same order: only the boundaries moved.
  std::vector<std::string> order;
  for (const auto& plan : grouped) {
    for (const auto& e : plan.entries) order.push_back(e.meta.name);
  }
  ASSERT_EQ(order.size(), metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) EXPECT_EQ(order[i], metas[i].name);
}

TEST(AtomicGroups, BucketTooSmallForAGroupNamesIt) {
  const ModelSpec spec = model_preset("deepseek-tiny");
  const auto metas = hf_tensors(spec);
  const auto groups = atomic_groups(metas, group_rule(spec));
  // Each down projection fits alone; the pair does not.
  const std::size_t q_a = 128 * 256 * 2, kv_a = 80 * 256 * 2;
  try {
    plan_buckets(metas, std::max(q_a, kv_a) + 1024, kDefaultBucketAlignment, groups);
    FAIL() << "expected a ConfigError";
  } catch (const comm::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("atomic group"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.0.self_attn.{q_a_proj,kv_a_proj_with_mqa}"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  }
  // Without groups the same size plans fine (each tensor fits or travels alone).
  EXPECT_NO_THROW(plan_buckets(metas, std::max(q_a, kv_a) + 1024));
}

TEST(AtomicGroups, GroupOpensTheNextBucketWhenItWouldEndPastTheLimit) {
  std::vector<TensorMeta> metas = {
      {"a.weight", DType::kUInt8, {600}},
      {"l.self_attn.q_proj.weight", DType::kUInt8, {300}},
      {"l.self_attn.k_proj.weight", DType::kUInt8, {200}},
      {"l.self_attn.v_proj.weight", DType::kUInt8, {200}},
      {"b.weight", DType::kUInt8, {50}},
  };
  const auto groups = atomic_groups(metas, GroupRule{});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].first, 1u);
  EXPECT_EQ(groups[0].end, 4u);
  // Plain: q joins a's bucket (768 + 300 <= 1100), k and v the next.
  const auto plain = plan_buckets(metas, 1100);
  EXPECT_TRUE(splits(plain, "l.self_attn.q_proj.weight", "l.self_attn.k_proj.weight"));
  const auto grouped = plan_buckets(metas, 1100, kDefaultBucketAlignment, groups);
  ASSERT_EQ(grouped.size(), 2u);
  EXPECT_EQ(grouped[0].entries.size(), 1u);
  EXPECT_EQ(grouped[1].entries.size(), 4u);  // q, k, v and b
}

}  // namespace
}  // namespace weightcast::sync

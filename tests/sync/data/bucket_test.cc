#include "sync/model/bucket.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/model.h"

namespace weightcast::sync {
namespace {

TensorMeta bytes_tensor(std::string name, std::int64_t bytes) {
  return TensorMeta{std::move(name), DType::kUInt8, {bytes}};
}

// The plan of uint8 tensors of these names and byte counts, at a bucket limit of 1024 bytes.
std::vector<BucketPlan> plan_bytes(const std::vector<std::pair<std::string, std::int64_t>>& sizes) {
  std::vector<TensorMeta> metas;
  for (const auto& [name, bytes] : sizes) metas.push_back(bytes_tensor(name, bytes));
  return plan_buckets(metas, 1024);
}

std::vector<std::size_t> offsets(const BucketPlan& plan) {
  std::vector<std::size_t> out;
  for (const auto& e : plan.entries) out.push_back(e.offset);
  return out;
}

TEST(PlanBuckets, EmptyModelHasNoBuckets) {
  EXPECT_TRUE(plan_buckets({}, 1024).empty());
  EXPECT_EQ(max_total_bytes({}), 0u);
}

TEST(PlanBuckets, AlignsOffsetsAndSplitsAtTheLimit) {
  const auto plans = plan_bytes({{"a", 100}, {"b", 100}, {"c", 600}, {"d", 300}, {"e", 1024}});
  // a at 0, b at 256 (padding counted); c would end at 512 + 600 > 1024 and opens bucket 1;
  // d would end at 768 + 300; e (exactly the limit) would end at 512 + 1024.
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(offsets(plans[0]), (std::vector<std::size_t>{0, 256}));
  EXPECT_EQ(plans[0].total_bytes, 356u);
  const std::vector<std::size_t> totals = {356, 600, 300, 1024};
  const std::vector<std::string> first = {"a", "c", "d", "e"};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i].sequence, i);
    EXPECT_EQ(plans[i].total_bytes, totals[i]);
    EXPECT_EQ(plans[i].entries.front().meta.name, first[i]);
    EXPECT_EQ(plans[i].entries.front().offset, 0u);
  }
}

TEST(PlanBuckets, ExactFitStaysAndOversizeTensorIsAlone) {
  const auto plans = plan_bytes({{"a", 256}, {"b", 768}, {"big", 5000}, {"c", 10}, {"d", 10}});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(offsets(plans[0]), (std::vector<std::size_t>{0, 256}));
  EXPECT_EQ(plans[0].total_bytes, 1024u);  // ends exactly at the limit: fits
  ASSERT_EQ(plans[1].entries.size(), 1u);
  EXPECT_EQ(plans[1].entries[0].meta.name, "big");
  EXPECT_EQ(plans[1].total_bytes, 5000u);
  EXPECT_EQ(offsets(plans[2]), (std::vector<std::size_t>{0, 256}));
  EXPECT_EQ(plans[2].total_bytes, 266u);
  EXPECT_EQ(max_total_bytes(plans), 5000u);
}

TEST(PlanBuckets, ZeroByteTensorsSitAtTheEndAndNeverOpenABucket) {
  const std::vector<TensorMeta> metas = {
      bytes_tensor("z0", 0), bytes_tensor("a", 10),
      bytes_tensor("z1", 0), bytes_tensor("big", 4096),
      bytes_tensor("z2", 0), TensorMeta{"z3", DType::kBFloat16, {0, 4096}}};
  const auto plans = plan_buckets(metas, 1024);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(offsets(plans[0]), (std::vector<std::size_t>{0, 0, 10}));
  EXPECT_EQ(plans[0].total_bytes, 10u);
  EXPECT_EQ(offsets(plans[1]), (std::vector<std::size_t>{0, 4096, 4096}));
  EXPECT_EQ(plans[1].total_bytes, 4096u);

  const auto leading = plan_buckets({bytes_tensor("z", 0), bytes_tensor("big", 4096)}, 1024);
  ASSERT_EQ(leading.size(), 1u);  // no collective for a bucket of zero bytes
  EXPECT_EQ(offsets(leading[0]), (std::vector<std::size_t>{0, 0}));

  const auto only_empty = plan_buckets({bytes_tensor("z", 0), bytes_tensor("y", 0)}, 1);
  ASSERT_EQ(only_empty.size(), 1u);
  EXPECT_EQ(only_empty[0].entries.size(), 2u);
  EXPECT_EQ(only_empty[0].total_bytes, 0u);
}

TEST(PlanBuckets, AlignmentIsAParameter) {
  const std::vector<TensorMeta> metas = {bytes_tensor("a", 3), bytes_tensor("b", 5),
                                         bytes_tensor("c", 1)};
  EXPECT_EQ(offsets(plan_buckets(metas, 100, 1)[0]), (std::vector<std::size_t>{0, 3, 8}));
  EXPECT_EQ(offsets(plan_buckets(metas, 100, 8)[0]), (std::vector<std::size_t>{0, 8, 16}));
  EXPECT_THROW(plan_buckets(metas, 100, 3), comm::EnforceError);
  EXPECT_THROW(plan_buckets(metas, 100, 0), comm::EnforceError);
  EXPECT_THROW(plan_buckets(metas, 0), comm::EnforceError);
}

TEST(MakeBucket, OverflowingOffsetsAreRejected) {
  const std::int64_t quarter = std::int64_t{1} << 62;
  std::vector<TensorMeta> metas(4, bytes_tensor("huge", quarter));
  EXPECT_THROW(make_bucket(0, metas), comm::BadRequestError);
  metas.pop_back();
  EXPECT_EQ(make_bucket(0, metas).total_bytes, 3 * static_cast<std::size_t>(quarter));
}

TEST(PackUnpack, RejectsSizeMismatches) {
  const auto plan = make_bucket(0, {bytes_tensor("a", 10), bytes_tensor("b", 20)});
  std::vector<std::byte> src(20), buffer(plan.total_bytes), small(plan.total_bytes - 1);
  auto source = [&](const BucketEntry& e) {
    return std::span<const std::byte>(src).first(e.bytes);
  };
  EXPECT_THROW(pack(plan, source, small), comm::EnforceError);
  EXPECT_THROW(unpack(small, plan), comm::EnforceError);
  auto wrong = [&](const BucketEntry&) { return std::span<const std::byte>(src).first(15); };
  EXPECT_THROW(pack(plan, wrong, buffer), comm::EnforceError);
  pack(plan, source, buffer);
  EXPECT_EQ(unpack(buffer, plan).size(), 2u);
}

// Random models, random limits and alignments: the plan keeps order and limits, make_bucket()
// rebuilds every bucket from its tensor list, and unpack(pack(x)) gives back every tensor.
TEST(PackUnpack, PropertyRoundTrip) {
  std::mt19937_64 rng(2024);
  const auto dtypes = all_dtypes();
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TensorMeta> metas;
    const int count = static_cast<int>(rng() % 12);
    for (int i = 0; i < count; ++i) {
      std::vector<std::int64_t> shape;
      const int rank = static_cast<int>(rng() % 4);
      for (int d = 0; d < rank; ++d) shape.push_back(static_cast<std::int64_t>(rng() % 40));
      metas.push_back(TensorMeta{"t" + std::to_string(trial) + "." + std::to_string(i),
                                 dtypes[rng() % dtypes.size()], shape});
    }
    const std::size_t max_bytes = 1 + rng() % 20000;
    const std::size_t alignment = std::size_t{1} << (rng() % 10);
    const auto plans = plan_buckets(metas, max_bytes, alignment);

    std::map<std::string, std::vector<std::byte>> data;
    for (const auto& m : metas) {
      auto& bytes = data[m.name];
      bytes.resize(m.byte_count());
      fill_tensor(m, static_cast<std::uint64_t>(trial), 0, bytes);
    }
    std::vector<TensorMeta> seen;
    for (std::size_t b = 0; b < plans.size(); ++b) {
      const BucketPlan& plan = plans[b];
      ASSERT_EQ(plan.sequence, b);
      ASSERT_FALSE(plan.entries.empty());
      if (plan.total_bytes == 0) {
        ASSERT_EQ(plans.size(), 1u) << "a bucket of zero bytes";
      }
      if (b > 0) {  // greedy: the first tensor did not fit behind the previous bucket
        const std::size_t end = plans[b - 1].total_bytes;
        const std::size_t aligned = (end + alignment - 1) / alignment * alignment;
        ASSERT_GT(aligned + plan.entries.front().bytes, max_bytes);
      }
      if (plan.entries.size() > 1) {
        std::size_t non_empty = 0;
        for (const auto& e : plan.entries) non_empty += e.bytes > 0 ? 1 : 0;
        if (non_empty > 1) {
          ASSERT_LE(plan.total_bytes, max_bytes);
        }
      }
      std::vector<TensorMeta> members;
      for (const auto& e : plan.entries) {
        members.push_back(e.meta);
        seen.push_back(e.meta);
        if (e.bytes > 0) {
          ASSERT_EQ(e.offset % alignment, 0u);
        }
      }
      ASSERT_EQ(make_bucket(plan.sequence, members, alignment), plan);

      std::vector<std::byte> buffer(plan.total_bytes, std::byte{0xAB});
      pack(
          plan, [&](const BucketEntry& e) { return std::span<const std::byte>(data[e.meta.name]); },
          buffer);
      std::vector<bool> covered(buffer.size(), false);
      const auto views = unpack(buffer, plan);
      ASSERT_EQ(views.size(), plan.entries.size());
      for (std::size_t i = 0; i < views.size(); ++i) {
        ASSERT_EQ(views[i].entry, &plan.entries[i]);
        const auto& want = data[views[i].entry->meta.name];
        ASSERT_TRUE(
            std::equal(views[i].bytes.begin(), views[i].bytes.end(), want.begin(), want.end()));
        for (std::size_t k = 0; k < views[i].bytes.size(); ++k)
          covered[plan.entries[i].offset + k] = true;
      }
      for (std::size_t k = 0; k < buffer.size(); ++k) {
        if (!covered[k]) {
          ASSERT_EQ(buffer[k], std::byte{0}) << "padding byte " << k;
        }
      }
    }
    ASSERT_EQ(seen, metas) << "order or membership changed";
  }
}

TEST(PlanBuckets, ModelPlanFromSourceAndEngineAgree) {
  // The engine learns one bucket's tensor list from the request and rebuilds the offsets.
  const auto metas = hf_tensors(model_preset("tiny"));
  const auto plans = plan_buckets(metas, 1 << 20);
  EXPECT_GT(plans.size(), 2u);
  for (const auto& p : plans) {
    std::vector<TensorMeta> members;
    for (const auto& e : p.entries) members.push_back(e.meta);
    EXPECT_EQ(make_bucket(p.sequence, members), p);
  }
}

}  // namespace
}  // namespace weightcast::sync

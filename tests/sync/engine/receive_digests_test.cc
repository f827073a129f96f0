// ReceiveDigests: digests made piece by piece as a bucket lands equal those of the whole tensors,
// whatever the pieces; anything it cannot digest in order is left to the caller (nullopt).
#include "sync/engine/receive/receive_digests.h"

#include <gtest/gtest.h>

#include <random>

#include "sync/model/bucket.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::engine {
namespace {

std::vector<TensorMeta> random_metas(std::mt19937& rng, int count) {
  std::vector<TensorMeta> out;
  for (int i = 0; i < count; ++i) {
    // Empty tensors too: they take no room and digest as empty.
    const std::int64_t elements = rng() % 5 == 0 ? 0 : static_cast<std::int64_t>(rng() % 3000);
    out.push_back({"t." + std::to_string(i), DType::kBFloat16, {elements}});
  }
  return out;
}

std::vector<std::byte> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

TEST(ReceiveDigests, PiecesInOrderGiveEveryWantedTensorsDigest) {
  for (std::uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    const auto metas = random_metas(rng, 1 + static_cast<int>(rng() % 20));
    const auto plans = plan_buckets(metas, std::size_t{1} << 30);
    ASSERT_EQ(plans.size(), 1u);
    const BucketPlan& plan = plans[0];
    const auto buffer = random_bytes(rng, plan.total_bytes);
    std::vector<bool> wanted;
    for (std::size_t i = 0; i < plan.entries.size(); ++i) wanted.push_back(rng() % 4 != 0);
    ReceiveDigests digests(plan, wanted, buffer.data());
    // Pieces of random sizes, from one byte to a few tensors, covering the bucket in order.
    std::size_t done = 0;
    while (done < plan.total_bytes) {
      const std::size_t n = std::min<std::size_t>(1 + rng() % 4000, plan.total_bytes - done);
      if (done == 0 && n == plan.total_bytes) break;  // the whole bucket at once: tested below
      digests.received(done, n);
      done += n;
    }
    if (done < plan.total_bytes) continue;
    const auto got = digests.take();
    ASSERT_EQ(got.size(), plan.entries.size());
    for (std::size_t i = 0; i < plan.entries.size(); ++i) {
      const BucketEntry& e = plan.entries[i];
      SCOPED_TRACE("seed " + std::to_string(seed) + " tensor " + e.meta.name);
      if (!wanted[i]) {
        EXPECT_FALSE(got[i]);
        continue;
      }
      ASSERT_TRUE(got[i]);
      EXPECT_EQ(*got[i], tensor_digest({buffer.data() + e.offset, e.bytes}));
    }
  }
}

TEST(ReceiveDigests, WholeBufferOutOfOrderOrUnfinishedIsLeftToTheCaller) {
  const std::vector<TensorMeta> metas = {{"a", DType::kFloat32, {1000}},
                                         {"b", DType::kFloat32, {3000}}};
  const auto plan = plan_buckets(metas, std::size_t{1} << 20)[0];
  std::mt19937 rng(3);
  const auto buffer = random_bytes(rng, plan.total_bytes);
  const std::vector<bool> all(2, true);
  {
    // In one call: the unpack thread digests it, overlapped with the next receive.
    ReceiveDigests d(plan, all, buffer.data());
    d.received(0, plan.total_bytes);
    for (const auto& g : d.take()) EXPECT_FALSE(g);
  }
  {
    ReceiveDigests d(plan, all, buffer.data());
    d.received(0, 100);
    d.received(200, 100);  // a gap: nothing more is trusted
    d.received(100, plan.total_bytes - 100);
    for (const auto& g : d.take()) EXPECT_FALSE(g);
  }
  {
    // Only tensor a arrived: its digest, none for b.
    ReceiveDigests d(plan, all, buffer.data());
    d.received(0, 2000);
    d.received(2000, plan.entries[1].offset + 10 - 2000);
    const auto got = d.take();
    ASSERT_TRUE(got[0]);
    EXPECT_EQ(*got[0], tensor_digest({buffer.data(), 4000}));
    EXPECT_FALSE(got[1]);
  }
}

TEST(ReceiveDigests, OverlappingOrOutOfBucketEntriesAreLeftToTheCaller) {
  BucketPlan plan;
  plan.total_bytes = 100;
  plan.entries = {{{"a", DType::kInt8, {60}}, 0, 60}, {{"b", DType::kInt8, {60}}, 40, 60}};
  std::vector<std::byte> buffer(100);
  ReceiveDigests overlap(plan, {true, true}, buffer.data());
  overlap.received(0, 50);
  overlap.received(50, 50);
  for (const auto& g : overlap.take()) EXPECT_FALSE(g);
  plan.entries = {{{"a", DType::kInt8, {60}}, 50, 60}};
  ReceiveDigests outside(plan, {true}, buffer.data());
  outside.received(0, 50);
  outside.received(50, 50);
  EXPECT_FALSE(outside.take()[0]);
}

}  // namespace
}  // namespace weightcast::sync::engine

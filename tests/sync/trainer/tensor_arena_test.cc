// TensorArena and in_place(): tensors written into an arena lie as every bucket plan over them
// carries them, so the packer lends the arena's bytes instead of packing; anything else is
// packed as before.
#include "sync/trainer/tensor_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>

#include "comm/errors.h"
#include "sync/trainer/packer.h"
#include "tests/sync/trainer/test_tensors.h"

namespace weightcast::sync::trainer {
namespace {

std::vector<TensorMeta> metas_of(const std::vector<HostTensor>& tensors) {
  std::vector<TensorMeta> out;
  for (const auto& t : tensors) out.push_back(t.meta);
  return out;
}

// An arena holding `tensors`' bytes, and a source reading it by name.
struct Filled {
  std::vector<TensorMeta> metas;
  TensorArena arena;
  std::map<std::string, std::size_t> index;

  explicit Filled(const std::vector<HostTensor>& tensors) : metas(metas_of(tensors)), arena(metas) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::copy(tensors[i].bytes.begin(), tensors[i].bytes.end(), arena[i].begin());
      index[metas[i].name] = i;
    }
  }
  TensorSource source() const {
    return [this](const BucketEntry& e) -> std::span<const std::byte> {
      return arena[index.at(e.meta.name)];
    };
  }
};

TEST(TensorArena, EveryBucketPlanLiesInPlace) {
  for (std::uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    const auto tensors = testing::random_tensors(seed, 1 + static_cast<int>(rng() % 25), 900);
    const Filled f(tensors);
    const std::size_t bucket_bytes = 64 + rng() % 5000;
    SCOPED_TRACE("seed " + std::to_string(seed) + " bucket " + std::to_string(bucket_bytes));
    for (const BucketPlan& plan : plan_buckets(f.metas, bucket_bytes)) {
      const auto first = std::find_if(plan.entries.begin(), plan.entries.end(),
                                      [](const BucketEntry& e) { return e.bytes > 0; });
      const auto bytes = in_place(plan, f.source());
      if (first == plan.entries.end()) {
        EXPECT_FALSE(bytes) << "a bucket of empty tensors has no bytes to lend";
        continue;
      }
      ASSERT_TRUE(bytes);
      EXPECT_EQ(bytes->data(), f.arena[f.index.at(first->meta.name)].data());
      EXPECT_EQ(bytes->size(), plan.total_bytes);
      // What a receiver unpacks from the lent bytes is each tensor's, and padding is zero.
      std::vector<bool> covered(plan.total_bytes, false);
      for (const auto& t : unpack(*bytes, plan)) {
        const auto& want = tensors[f.index.at(t.entry->meta.name)].bytes;
        EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), want.begin(), want.end()));
        for (std::size_t i = 0; i < t.bytes.size(); ++i) covered[t.entry->offset + i] = true;
      }
      for (std::size_t i = 0; i < plan.total_bytes; ++i) {
        if (!covered[i]) {
          EXPECT_EQ((*bytes)[i], std::byte{0}) << "padding at " << i;
        }
      }
    }
  }
}

TEST(TensorArena, PackerLendsTheArenaAndTakesNoBuffer) {
  const auto tensors = testing::random_tensors(7, 20, 800);
  const Filled f(tensors);
  const auto plans = plan_buckets(f.metas, 2000);
  ASSERT_GT(plans.size(), 2u);
  auto pool = std::make_shared<PackBuffers>();
  BucketPacker packer(plans, f.source(), 2, pool);
  for (std::uint64_t k = 0; k < plans.size(); ++k) {
    const auto bytes = packer.acquire(k, comm::deadline_after(comm::Millis(5000)));
    const auto lent = in_place(plans[k], f.source());
    ASSERT_TRUE(lent);
    EXPECT_EQ(bytes.data(), lent->data()) << "bucket " << k << " was copied";
    packer.release(k);
  }
  EXPECT_EQ(pool->allocations(), 0u);
}

TEST(TensorArena, ATensorOutsideTheArenaIsPacked) {
  const auto tensors = testing::random_tensors(8, 6, 300);
  const Filled f(tensors);
  const auto plans = plan_buckets(f.metas, 1 << 20);
  ASSERT_EQ(plans.size(), 1u);
  ASSERT_GT(plans[0].entries.size(), 2u);
  // A later non-empty tensor comes from its own vector: the bucket no longer lies in one place.
  const auto later = std::find_if(plans[0].entries.begin() + 1, plans[0].entries.end(),
                                  [](const BucketEntry& e) { return e.bytes > 0; });
  ASSERT_NE(later, plans[0].entries.end());
  const std::string moved = later->meta.name;
  const std::vector<std::byte> elsewhere = tensors[f.index.at(moved)].bytes;
  const TensorSource mixed = [&](const BucketEntry& e) -> std::span<const std::byte> {
    if (e.meta.name == moved) return elsewhere;
    return f.arena[f.index.at(e.meta.name)];
  };
  EXPECT_FALSE(in_place(plans[0], mixed));
  auto pool = std::make_shared<PackBuffers>();
  BucketPacker packer(plans, mixed, 2, pool);
  const auto bytes = packer.acquire(0, comm::deadline_after(comm::Millis(5000)));
  for (const auto& t : unpack(bytes, plans[0])) {
    const auto& want = tensors[f.index.at(t.entry->meta.name)].bytes;
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), want.begin(), want.end()));
  }
  EXPECT_EQ(pool->allocations(), 1u);
  packer.release(0);
}

TEST(TensorArena, UnalignedPlansArePacked) {
  // SGLang's flattened buckets have no alignment: an arena at 256 bytes does not match them.
  const std::vector<TensorMeta> metas = {{"a", DType::kFloat32, {3}}, {"b", DType::kFloat32, {5}}};
  const TensorArena arena(metas);
  const auto plans = plan_buckets(metas, 1 << 20, 1);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_FALSE(in_place(plans[0], [&](const BucketEntry& e) -> std::span<const std::byte> {
    return arena[e.meta.name == "a" ? 0 : 1];
  }));
}

TEST(TensorArena, PlansWithAGapOfAPageOrAnOffsetStartAreNotLent) {
  // Tensors at exactly the plan's distance, but the plan leaves a page between them: that page
  // is nobody's, so the bucket is packed rather than lent.
  const std::vector<TensorMeta> metas = {
      {"a", DType::kInt8, {100}}, {"b", DType::kInt8, {100}}, {"c", DType::kInt8, {5000}}};
  const TensorArena arena(metas, 8192);
  const auto source = [&](const BucketEntry& e) -> std::span<const std::byte> {
    return arena[static_cast<std::size_t>(e.meta.name[0] - 'a')];
  };
  const auto plans = plan_buckets(metas, 1 << 20, 8192);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_FALSE(in_place(plans[0], source));
  // The same arena with a plan of its own alignment but starting at tensor b's offset.
  BucketPlan shifted;
  shifted.entries = {{metas[1], 8192, 100}};
  shifted.total_bytes = 8292;
  EXPECT_FALSE(in_place(shifted, source));
}

TEST(TensorArena, RejectsABadAlignmentAndIndex) {
  const std::vector<TensorMeta> metas = {{"a", DType::kFloat32, {3}}};
  EXPECT_THROW(TensorArena(metas, 3), comm::EnforceError);
  const TensorArena arena(metas);
  EXPECT_EQ(arena.size(), 1u);
  EXPECT_EQ(arena[0].size(), 12u);
  EXPECT_THROW(arena[1], comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync::trainer

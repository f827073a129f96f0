// The zero-copy update path: buckets are received into pool blocks, staged as views of them,
// committed by swapping the views into the runners, and the blocks of replaced weights are reused
// by the next update. Fake channels, no sockets.
#include <gtest/gtest.h>

#include "sync/engine/receive/receive_pipeline.h"
#include "sync/engine/stage/block_pool.h"
#include "tests/sync/engine/fake_channel.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using namespace std::chrono_literals;
using testing::FakeSource;
using testing::laid_out;
using testing::pack_bucket;
using testing::tensor;

struct Update {
  std::vector<RawTensor> tensors;  // per bucket, in order
  std::vector<testing::PackedBucket> buckets;
};

// Three buckets of two tensors each, distinct bytes per step.
Update make_update(std::uint64_t step) {
  Update u;
  for (std::uint64_t k = 0; k < 3; ++k) {
    std::vector<RawTensor> in_bucket;
    for (int i = 0; i < 2; ++i) {
      in_bucket.push_back(tensor("model.l" + std::to_string(k) + "_" + std::to_string(i),
                                 {32, 64 * (i + 1)}, step));
    }
    u.buckets.push_back(pack_bucket(k, in_bucket));
    u.tensors.insert(u.tensors.end(), in_bucket.begin(), in_bucket.end());
  }
  return u;
}

class PoolTest : public ::testing::Test {
 protected:
  void make(Layout draft_layout, const std::string& draft_filter, int ranks) {
    RunnerConfig target{Runner::kTarget, NameFilter::parse("model.*"), Layout::kShuffle, {}, 0,
                        "generated"};
    RunnerConfig draft{Runner::kDraft, NameFilter::parse(draft_filter), draft_layout, {}, 0,
                       "generated"};
    runners_ = std::make_unique<RunnerSet>(std::vector<RunnerConfig>{target, draft}, "v0", ranks);
    runners_->load_initial(Runner::kTarget, make_update(0).tensors);
    GroupSpec spec;
    spec.group_name = "g";
    GroupOptions opts;
    opts.comm_timeout = comm::Millis(10000);
    opts.pool = runners_->block_pool();
    group_ = std::make_unique<Group>(spec, source_->make_channels(ranks), opts);
  }

  // Receives `u` into a fresh staging for session `session` (all buckets, all ranks).
  std::shared_ptr<Staging> receive(const Update& u, std::uint64_t session, Selector selector) {
    auto staging = std::make_shared<Staging>(group_->rank_count());
    std::vector<std::shared_ptr<BucketJob>> jobs;
    for (const auto& b : u.buckets) {
      std::vector<std::vector<Runner>> dest;
      for (const auto& e : b.plan.entries)
        dest.push_back(runners_->destinations(selector, e.meta.name));
      jobs.push_back(std::make_shared<BucketJob>(session, b.plan, dest, staging));
      EXPECT_FALSE(group_->submit(jobs.back()));
      source_->broadcast(b.bytes);
    }
    for (const auto& job : jobs) {
      auto result = job->wait(comm::deadline_after(10s));
      EXPECT_TRUE(result && result->status == 200) << (result ? result->message : "timeout");
    }
    return staging;
  }

  std::vector<std::byte> resident(Runner id, const std::string& name) {
    std::vector<std::byte> out;
    runners_->with_tensor(id, name, [&](const ResidentTensor& t) { out = t.bytes.to_vector(); });
    return out;
  }

  std::shared_ptr<FakeSource> source_ = std::make_shared<FakeSource>();
  std::unique_ptr<RunnerSet> runners_;
  std::unique_ptr<Group> group_;
};

TEST(BlockPool, ReusesSplitsAndReleasesOnesTooSmall) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  BlockPool pool;
  { auto a = pool.acquire(3 * kMiB), b = pool.acquire(kMiB); }
  EXPECT_EQ(pool.stats().allocations, 2u);
  EXPECT_EQ(pool.stats().free_bytes, 4 * kMiB);
  auto c = pool.acquire(900 * 1024);  // best fit: the 1 MiB block, too little slack to split
  EXPECT_EQ(c->capacity(), kMiB);
  EXPECT_EQ(pool.stats().reuses, 1u);
  auto d = pool.acquire(kMiB);  // from the 3 MiB block, split: 2 MiB stay pooled
  EXPECT_EQ(d->capacity(), kMiB);
  EXPECT_EQ(pool.stats().free_bytes, 2 * kMiB);
  auto e = pool.acquire(5 * kMiB);  // nothing fits: a new arena; the 3 MiB one is partly in use
  EXPECT_EQ(pool.stats().allocations, 3u);
  EXPECT_EQ(pool.stats().free_bytes, 2 * kMiB) << "a piece of an arena in use is kept";
  c.reset();  // the 1 MiB arena is wholly free, and smaller than the next request
  auto f = pool.acquire(6 * kMiB);
  EXPECT_EQ(pool.stats().allocations, 4u);
  EXPECT_EQ(pool.stats().free_bytes, 2 * kMiB) << "the wholly free 1 MiB arena is dropped";
  EXPECT_EQ(pool.stats().allocated_bytes, (3 + 5 + 6) * kMiB);
  pool.reserve(8 * kMiB);
  auto g = pool.acquire(8 * kMiB);
  EXPECT_EQ(pool.stats().allocations, 5u) << "a reserved arena serves the next request";
  EXPECT_EQ(pool.stats().reuses, 3u);
}

TEST(BlockPool, BlocksGivenBackMergeWithTheirFreeNeighbours) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  BlockPool pool;
  pool.reserve(16 * kMiB);
  auto a = pool.acquire(4 * kMiB);
  auto b = pool.acquire(4 * kMiB);
  auto c = pool.acquire(4 * kMiB);
  EXPECT_EQ(b->data(), a->data() + 4 * kMiB) << "split pieces follow each other";
  // Given back out of order: the middle first, then its neighbours.
  b.reset();
  a.reset();
  c.reset();
  EXPECT_EQ(pool.stats().free_bytes, 16 * kMiB);
  auto whole = pool.acquire(16 * kMiB);
  EXPECT_EQ(pool.stats().allocations, 1u) << "the arena is whole again, no new mapping";
  EXPECT_EQ(whole->capacity(), 16 * kMiB);
  // A request larger than every arena maps a new one and drops the smaller, wholly free one.
  whole.reset();
  auto x = pool.acquire(20 * kMiB);
  EXPECT_EQ(pool.stats().allocations, 2u);
  EXPECT_EQ(pool.stats().allocated_bytes, 20 * kMiB) << "the smaller, wholly free arena dropped";
}

TEST_F(PoolTest, StagedTensorsAreViewsOfTheReceivedBucket) {
  make(Layout::kNone, "mtp.*", /*ranks=*/2);
  const Update u = make_update(1);
  auto staging = receive(u, 1, Selector::kAll);
  auto staged = staging->take(Runner::kTarget);
  ASSERT_EQ(staged.size(), u.tensors.size());
  for (const auto& b : u.buckets) {
    const auto& first = staged.at(b.plan.entries[0].meta.name);
    for (const auto& e : b.plan.entries) {
      const auto& s = staged.at(e.meta.name);
      // Same block, at the plan's offset: no copy was made on the engine.
      EXPECT_EQ(s.bytes.owner(), first.bytes.owner());
      EXPECT_EQ(s.bytes.data(), first.bytes.data() + e.offset);
      EXPECT_EQ(s.rank_digests[1], s.rank_digests[0]);
    }
  }
}

TEST_F(PoolTest, TwentyUpdatesReuseThePooledBlocks) {
  make(Layout::kNone, "mtp.*", /*ranks=*/2);
  BlockPoolStats after_warmup;
  for (std::uint64_t step = 1; step <= 20; ++step) {
    const Update u = make_update(step);
    auto staging = receive(u, step, Selector::kAll);
    runners_->commit(*staging, Selector::kAll, "v" + std::to_string(step), false);
    ASSERT_EQ(resident(Runner::kTarget, u.tensors[3].meta.name),
              laid_out(u.tensors[3], Layout::kShuffle));
    // Update 1 receives into the arena reserved at load_initial, update 2 into the block of
    // the initial weights, and every later one into blocks an earlier update's weights gave back.
    if (step == 1) after_warmup = runners_->block_pool()->stats();
  }
  const BlockPoolStats end = runners_->block_pool()->stats();
  EXPECT_EQ(end.allocations, after_warmup.allocations) << "no allocation after the warm-up";
  EXPECT_EQ(end.allocated_bytes, after_warmup.allocated_bytes) << "pool size stays flat";
  EXPECT_GE(end.reuses, 20u * 3u) << "every bucket of updates 1..20 reused a block";
}

TEST_F(PoolTest, TensorStagedForTwoRunnersIsCopiedForTheSecond) {
  make(Layout::kShuffle, "model.*", /*ranks=*/1);  // the draft loads the same names
  const Update u = make_update(1);
  auto staging = receive(u, 1, Selector::kAll);
  runners_->commit(*staging, Selector::kAll, "v1", false);
  for (const auto& t : u.tensors) {
    EXPECT_EQ(resident(Runner::kTarget, t.meta.name), laid_out(t, Layout::kShuffle));
    EXPECT_EQ(resident(Runner::kDraft, t.meta.name), laid_out(t, Layout::kShuffle))
        << "shuffled once, not twice through a shared view";
  }
}

TEST_F(PoolTest, DiscardedStagingGivesItsBlocksBack) {
  make(Layout::kNone, "mtp.*", /*ranks=*/2);
  const BlockPoolStats before = runners_->block_pool()->stats();
  auto staging = receive(make_update(1), 1, Selector::kAll);
  EXPECT_LT(runners_->block_pool()->stats().free_bytes, before.free_bytes);
  staging->discard();
  const BlockPoolStats s = runners_->block_pool()->stats();
  EXPECT_EQ(s.free_bytes, before.free_bytes) << "every staged block is back in the pool";
  EXPECT_EQ(s.allocations, before.allocations) << "served by the reserved arena";
  EXPECT_EQ(resident(Runner::kTarget, "model.l0_0"),
            laid_out(make_update(0).tensors[0], Layout::kShuffle))
      << "the previous weights stay";
}

}  // namespace
}  // namespace weightcast::sync::engine

// Group: sequence order, overlap of unpack and receive, failures and refusals, with fake
// channels (no sockets).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "comm/errors.h"
#include "sync/engine/receive/receive_pipeline.h"
#include "tests/sync/engine/fake_channel.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using namespace std::chrono_literals;
using testing::FakeSource;
using testing::pack_bucket;
using testing::tensor;

constexpr auto kWait = 10s;  // bound of every wait in these tests; never reached when passing

struct Bucket {
  std::vector<RawTensor> tensors;
  testing::PackedBucket packed;
};

// Bucket k holds k + 1 tensors, so buckets differ in size and a receive out of order fails.
Bucket make(std::uint64_t k) {
  Bucket b;
  for (std::uint64_t i = 0; i <= k; ++i) {
    b.tensors.push_back(tensor("model.b" + std::to_string(k) + "_" + std::to_string(i),
                               {16, static_cast<std::int64_t>(32 * (i + 1))}, k));
  }
  b.packed = pack_bucket(k, b.tensors);
  return b;
}

std::shared_ptr<BucketJob> job_for(const Bucket& b, std::shared_ptr<Staging> staging,
                                   std::uint64_t session = 1) {
  std::vector<std::vector<Runner>> dest(b.tensors.size(), {Runner::kTarget});
  return std::make_shared<BucketJob>(session, b.packed.plan, dest, std::move(staging));
}

class GroupTest : public ::testing::Test {
 protected:
  std::unique_ptr<Group> make_group(int ranks, comm::Millis timeout = comm::Millis(10000)) {
    GroupSpec spec;
    spec.group_name = "g";
    GroupOptions opts;
    opts.comm_timeout = timeout;
    opts.max_ahead = 4;
    return std::make_unique<Group>(spec, source_->make_channels(ranks), opts);
  }
  std::shared_ptr<FakeSource> source_ = std::make_shared<FakeSource>();
};

TEST_F(GroupTest, ReceivesInSequenceOrderWhateverTheSubmitOrder) {
  auto group = make_group(/*ranks=*/2);
  auto staging = std::make_shared<Staging>(2);
  std::vector<Bucket> buckets = {make(0), make(1), make(2)};
  std::vector<std::shared_ptr<BucketJob>> jobs;
  for (int k : {2, 0, 1}) {
    jobs.push_back(job_for(buckets[static_cast<std::size_t>(k)], staging));
    ASSERT_FALSE(group->submit(jobs.back()));
  }
  for (const auto& b : buckets) source_->broadcast(b.packed.bytes);
  for (const auto& job : jobs) {
    auto result = job->wait(comm::deadline_after(kWait));
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200) << result->message;
  }
  EXPECT_FALSE(group->busy());
  EXPECT_EQ(group->buckets_received(), 3u);
  auto staged = staging->take(Runner::kTarget);
  ASSERT_EQ(staged.size(), 6u);
  for (const auto& b : buckets) {
    for (const auto& t : b.tensors) {
      const auto& s = staged.at(t.meta.name);
      EXPECT_EQ(s.bytes, t.bytes);
      ASSERT_EQ(s.rank_digests.size(), 2u);
      EXPECT_EQ(s.rank_digests[0], tensor_digest(t.bytes));
      EXPECT_EQ(s.rank_digests[1], tensor_digest(t.bytes));
    }
  }
}

TEST_F(GroupTest, UnpackOfBucketKOverlapsReceiveOfKPlus1) {
  auto staging = std::make_shared<Staging>(1);
  std::atomic<bool> seen_staged{false};
  // Rank 0's receive of bucket 1 waits until bucket 0 is staged. If unpacking ran after the next
  // receive on the same thread, bucket 0 would never be staged here and the hook would give up.
  source_->set_hook([&](int, int index) {
    if (index != 1) return;
    const auto deadline = comm::deadline_after(kWait);
    while (!comm::expired(deadline)) {
      if (staging->tensor_count(Runner::kTarget) >= 1) {
        seen_staged = true;
        return;
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  auto group = make_group(1);
  auto b0 = make(0), b1 = make(1);
  auto j0 = job_for(b0, staging), j1 = job_for(b1, staging);
  ASSERT_FALSE(group->submit(j0));
  ASSERT_FALSE(group->submit(j1));
  source_->broadcast(b0.packed.bytes);
  source_->broadcast(b1.packed.bytes);
  auto r1 = j1->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->status, 200) << r1->message;
  EXPECT_TRUE(seen_staged);
}

TEST_F(GroupTest, ReceiveTimeoutFailsTheJobAndAbortsTheGroup) {
  auto group = make_group(2, comm::Millis(200));
  auto staging = std::make_shared<Staging>(2);
  auto job = job_for(make(0), staging);
  ASSERT_FALSE(group->submit(job));
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 504) << result->message;
  EXPECT_NE(result->message.find("bucket 0"), std::string::npos) << result->message;
  EXPECT_TRUE(group->aborted());
  auto again = group->submit(job_for(make(1), staging));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409);
  EXPECT_NE(again->message.find("aborted"), std::string::npos);
}

TEST_F(GroupTest, ARanksOwnFailureIsReportedOverItsNeighbourSeeingItLeave) {
  // Rank 1 times out and hangs up; rank 0 sees it leave first and fails with a PeerError. The
  // answer must name rank 1's timeout, the cause, whichever of the two fails first.
  source_->set_hook([](int rank, int) {
    if (rank == 0) throw comm::PeerError("rank 2", "rank 2 left the broadcast");
    std::this_thread::sleep_for(10ms);
    throw comm::TimeoutError("rank 2 timed out copying");
  });
  auto group = make_group(2);
  auto job = job_for(make(0), std::make_shared<Staging>(2));
  ASSERT_FALSE(group->submit(job));
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 504) << result->message;
  EXPECT_NE(result->message.find("engine rank 1 (group rank 2), bucket 0: rank 2 timed out"),
            std::string::npos)
      << result->message;
}

TEST_F(GroupTest, WrongSizeFromThePeerFailsWith500) {
  auto group = make_group(1);
  Bucket bigger = make(1);
  bigger.packed.plan.sequence = 0;
  auto job = job_for(bigger, std::make_shared<Staging>(1));
  ASSERT_FALSE(group->submit(job));
  source_->broadcast(make(0).packed.bytes);
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 500) << result->message;
}

TEST_F(GroupTest, MissingEarlierBucketFailsWithinTheTimeout) {
  auto group = make_group(1, comm::Millis(200));
  auto job = job_for(make(1), std::make_shared<Staging>(1));
  ASSERT_FALSE(group->submit(job));
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 504);
  EXPECT_NE(result->message.find("bucket 0"), std::string::npos) << result->message;
  EXPECT_NE(result->message.find("never arrived"), std::string::npos) << result->message;
}

TEST_F(GroupTest, DuplicateBehindAndFarAheadSequencesAreRefused) {
  auto group = make_group(1);
  auto staging = std::make_shared<Staging>(1);
  auto b0 = make(0);
  ASSERT_FALSE(group->submit(job_for(b0, staging)));
  auto dup = group->submit(job_for(b0, staging));
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup->status, 409);
  Bucket far = make(0);
  far.packed.plan.sequence = 4;  // max_ahead = 4 beyond the next expected (0)
  auto ahead = group->submit(job_for(far, staging));
  ASSERT_TRUE(ahead);
  EXPECT_EQ(ahead->status, 429);
  source_->broadcast(b0.packed.bytes);
  const auto deadline = comm::deadline_after(kWait);
  while (group->busy() && !comm::expired(deadline)) std::this_thread::sleep_for(1ms);
  auto behind = group->submit(job_for(b0, staging));
  ASSERT_TRUE(behind) << "bucket 0 was already received";
  EXPECT_EQ(behind->status, 409);
}

TEST_F(GroupTest, NewSessionRestartsTheSequence) {
  auto group = make_group(1);
  auto b0 = make(0);
  auto first = job_for(b0, std::make_shared<Staging>(1), /*session=*/1);
  ASSERT_FALSE(group->submit(first));
  source_->broadcast(b0.packed.bytes);
  ASSERT_TRUE(first->wait(comm::deadline_after(kWait)));
  EXPECT_TRUE(group->used_in(1));
  auto second = job_for(b0, std::make_shared<Staging>(1), /*session=*/2);
  ASSERT_FALSE(group->submit(second));
  EXPECT_TRUE(group->used_in(2));
  EXPECT_FALSE(group->used_in(1));
  source_->broadcast(b0.packed.bytes);
  auto result = second->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200) << result->message;
}

TEST_F(GroupTest, AbortFailsPendingJobsWithTheGivenStatus) {
  auto group = make_group(2);
  auto job = job_for(make(0), std::make_shared<Staging>(2));
  ASSERT_FALSE(group->submit(job));
  group->abort(409, "destroyed by the test");
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 409);
  EXPECT_EQ(result->message, "destroyed by the test");
  EXPECT_EQ(group->abort_reason(), "destroyed by the test");
}

TEST_F(GroupTest, DiscardedStagingCompletesWith409) {
  auto group = make_group(1);
  auto staging = std::make_shared<Staging>(1);
  auto b0 = make(0);
  auto job = job_for(b0, staging);
  ASSERT_FALSE(group->submit(job));
  staging->discard();
  source_->broadcast(b0.packed.bytes);
  auto result = job->wait(comm::deadline_after(kWait));
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 409);
  EXPECT_FALSE(group->aborted()) << "the data plane itself is fine";
}

TEST(FailureStatus, TimeoutIs504OthersAre500) {
  EXPECT_EQ(failure_status(comm::TimeoutError("t")), 504);
  EXPECT_EQ(failure_status(comm::PeerError("p", "x")), 500);
  EXPECT_EQ(failure_status(std::runtime_error("x")), 500);
}

}  // namespace
}  // namespace weightcast::sync::engine

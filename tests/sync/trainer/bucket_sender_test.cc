// The pipelined bucket path of one stage — BucketPacker (double buffering) and send_buckets()
// (look-ahead requests, bounded in flight, failure handling) — on top of sync/bucket, against
// fake engines that unpack what was broadcast.
#include "sync/trainer/bucket_sender.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "comm/errors.h"
#include "sync/trainer/packer.h"
#include "tests/sync/trainer/fakes.h"
#include "tests/sync/trainer/test_tensors.h"

namespace weightcast::sync::trainer {
namespace {

using testing::FakeCommunicator;
using testing::FakeEngine;
using testing::FakeWire;

UpdateSession target_session() {
  return join_session("target 1");
}

// Begins a target session on each engine, as the updater would before the data phase.
void begin(std::vector<FakeEngine*> engines) {
  for (auto* e : engines) e->begin_weight_update({Selector::kTarget});
}

std::vector<TensorMeta> metas_of(const std::vector<HostTensor>& tensors) {
  std::vector<TensorMeta> out;
  for (const auto& t : tensors) out.push_back(t.meta);
  return out;
}

// Packs every bucket through the packer and checks that unpacking gives back each tensor's bytes,
// in the original order.
void expect_round_trip(const std::vector<HostTensor>& tensors, std::size_t bucket_bytes) {
  const auto plans = plan_buckets(metas_of(tensors), bucket_bytes);
  std::map<std::string, const HostTensor*> by_name;
  for (const auto& t : tensors) by_name[t.meta.name] = &t;
  BucketPacker packer(plans, [&](const BucketEntry& e) {
    return std::span<const std::byte>(by_name.at(e.meta.name)->bytes);
  });
  std::size_t next = 0;
  for (std::uint64_t k = 0; k < plans.size(); ++k) {
    const auto bytes = packer.acquire(k, comm::deadline_after(comm::Millis(5000)));
    ASSERT_EQ(bytes.size(), plans[k].total_bytes);
    for (const auto& t : unpack(bytes, plans[k])) {
      ASSERT_LT(next, tensors.size());
      ASSERT_EQ(t.entry->meta.name, tensors[next].meta.name) << "order changed";
      ASSERT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), tensors[next].bytes.begin(),
                             tensors[next].bytes.end()))
          << t.entry->meta.name;
      ++next;
    }
    packer.release(k);
  }
  EXPECT_EQ(next, tensors.size());
}

TEST(BucketPacker, UnpackingReturnsThePackedBytes) {
  // Property test over random models and bucket sizes, oversize tensors included.
  for (std::uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    const auto tensors = testing::random_tensors(seed, 1 + static_cast<int>(rng() % 30), 700);
    const std::size_t bucket_bytes = 64 + rng() % 3000;
    SCOPED_TRACE("seed " + std::to_string(seed) + " bucket " + std::to_string(bucket_bytes));
    expect_round_trip(tensors, bucket_bytes);
  }
}

TEST(BucketPacker, EmptyModelHasNoBuckets) {
  const std::vector<BucketPlan> plans;
  BucketPacker packer(plans, [](const BucketEntry&) { return std::span<const std::byte>(); });
  EXPECT_THROW(packer.acquire(0, comm::deadline_after(comm::Millis(10))), comm::EnforceError);
}

TEST(BucketPacker, RingIsBoundedAndOrdered) {
  const auto tensors = testing::random_tensors(9, 12, 400);
  const auto plans = plan_buckets(metas_of(tensors), 512);
  ASSERT_GT(plans.size(), 3u);
  std::map<std::string, std::span<const std::byte>> bytes;
  for (const auto& t : tensors) bytes[t.meta.name] = t.bytes;
  BucketPacker packer(plans, [&](const BucketEntry& e) { return bytes.at(e.meta.name); });
  const auto later = [] { return comm::deadline_after(comm::Millis(5000)); };
  EXPECT_THROW(packer.acquire(1, later()), comm::EnforceError);  // out of order
  packer.acquire(0, later());
  packer.acquire(1, later());
  // Two buffers, both handed out: a third bucket needs one back first.
  EXPECT_THROW(packer.acquire(2, later()), comm::EnforceError);
  EXPECT_THROW(packer.release(1), comm::EnforceError);  // oldest first
  packer.release(0);
  EXPECT_NO_THROW(packer.acquire(2, later()));
}

TEST(BucketPacker, PackingErrorsReachTheConsumer) {
  const auto tensors = testing::random_tensors(10, 3, 100);
  const auto plans = plan_buckets(metas_of(tensors), 1 << 20);
  BucketPacker packer(plans, [](const BucketEntry&) { return std::span<const std::byte>(); });
  EXPECT_THROW(packer.acquire(0, comm::deadline_after(comm::Millis(5000))), comm::EnforceError);
}

TEST(BucketPacker, SlowPackingTimesOut) {
  const auto tensors = testing::random_tensors(11, 1, 100);
  const auto plans = plan_buckets(metas_of(tensors), 1 << 20);
  BucketPacker packer(plans, [&](const BucketEntry&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return std::span<const std::byte>(tensors[0].bytes);
  });
  EXPECT_THROW(packer.acquire(0, comm::deadline_after(comm::Millis(20))), comm::TimeoutError);
}

struct SendFixture {
  FakeWire wire;
  FakeEngine a{"http://a:1", wire};
  FakeEngine b{"http://b:2", wire, 2};
  std::vector<EngineApi*> engines{&a, &b};
  FakeCommunicator comm{wire, 4};
  BucketSendOptions options;

  SendFixture() {
    options.failure_grace = comm::Millis(2000);
    begin({&a, &b});
  }
  BucketSendResult send(const std::vector<HostTensor>& tensors) {
    const auto views_of = views(tensors);
    return send_buckets(target_session(), "g", comm, engines, views_of, options);
  }
};

TEST(SendBuckets, BoundariesAndOversizeTensors) {
  SendFixture f;
  f.options.bucket_bytes = 1024;
  // 4 x 256 B fill one bucket exactly; a 3000 B tensor travels alone; then 2 small ones.
  std::vector<HostTensor> tensors;
  const auto add = [&](const std::string& name, std::int64_t bytes) {
    HostTensor t{{name, DType::kUInt8, {bytes}}, std::vector<std::byte>(bytes, std::byte{7})};
    tensors.push_back(std::move(t));
  };
  for (int i = 0; i < 4; ++i) add("fill." + std::to_string(i), 256);
  add("big", 3000);
  add("tail.0", 10);
  add("tail.1", 10);
  const auto result = f.send(tensors);
  ASSERT_TRUE(result.ok) << result.error;
  ASSERT_EQ(result.buckets, 3u);
  EXPECT_EQ(f.wire.broadcasts[0].size(), 1024u);
  EXPECT_EQ(f.wire.broadcasts[1].size(), 3000u);
  EXPECT_EQ(result.bytes, 4u * 256 + 3000 + 20);
  const auto requests = f.a.bucket_requests();
  ASSERT_EQ(requests.size(), 3u);
  std::set<std::uint64_t> sequences;
  for (const auto& r : requests) sequences.insert(r.sequence.value_or(~0ull));
  EXPECT_EQ(sequences, (std::set<std::uint64_t>{0, 1, 2}));
}

TEST(SendBuckets, EmptyModelSendsNothing) {
  SendFixture f;
  const auto result = f.send({});
  EXPECT_TRUE(result.ok);
  EXPECT_EQ(result.buckets, 0u);
  EXPECT_TRUE(f.wire.broadcasts.empty());
  EXPECT_TRUE(f.a.bucket_requests().empty());
}

TEST(SendBuckets, NextRequestIsOutBeforeTheBroadcastAndInFlightIsBounded) {
  SendFixture f;
  f.options.bucket_bytes = 2048;
  const auto tensors = testing::random_tensors(12, 60, 900);
  const auto metas = metas_of(tensors);
  f.wire.engines = 2;
  f.wire.total_buckets = plan_buckets(metas, f.options.bucket_bytes).size();
  ASSERT_GT(f.wire.total_buckets, 4u);
  const auto result = f.send(tensors);
  ASSERT_TRUE(result.ok) << result.error;
  // Only the first broadcast may go before the second request: it does not wait for the second
  // bucket's digests.
  EXPECT_LE(f.wire.missing_lookahead, 1);
  EXPECT_LE(f.a.max_open_buckets(), 2);
  EXPECT_LE(f.b.max_open_buckets(), 2);
  EXPECT_EQ(f.a.committed().size(), 0u);  // staged only; the session is still open
}

TEST(SendBuckets, RequestsCarryTheProducersDigestsInsteadOfHashingAgain) {
  SendFixture f;
  f.options.bucket_bytes = 2048;
  const auto tensors = testing::random_tensors(14, 12, 900);
  auto with_digests = views(tensors);
  // Tensor 0's digest as its producer made it, the others' none: the sender hashes those. A
  // deliberately wrong one shows that the sender carries it rather than hashing the bytes (an
  // engine refuses such a bucket: tests/sync/engine/http_digest_test.cc).
  const Digest made{1, 2};
  with_digests[0].digest = &made;
  const auto result =
      send_buckets(target_session(), "g", f.comm, f.engines, with_digests, f.options);
  ASSERT_TRUE(result.ok) << result.error;
  std::map<std::string, std::string> sent;
  for (const auto& r : f.a.bucket_requests()) {
    ASSERT_EQ(r.digests.size(), r.tensors.size());
    for (std::size_t i = 0; i < r.tensors.size(); ++i) sent[r.tensors[i].name] = r.digests[i];
  }
  ASSERT_EQ(sent.size(), tensors.size());
  EXPECT_EQ(sent.at(tensors[0].meta.name), to_string(made));
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    EXPECT_EQ(sent.at(tensors[i].meta.name), to_string(tensor_digest(tensors[i].bytes)))
        << tensors[i].meta.name;
  }
}

TEST(SendBuckets, OneInFlightStillCompletes) {
  SendFixture f;
  f.options.bucket_bytes = 2048;
  f.options.max_in_flight = 1;
  const auto result = f.send(testing::random_tensors(13, 30, 900));
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(f.a.max_open_buckets(), 1);
}

TEST(SendBuckets, EngineFailureStopsTheBroadcastsAndIsReported) {
  SendFixture f;
  f.options.bucket_bytes = 1024;
  f.b.fail_route("POST /update_weights_from_distributed", 0, /*after=*/3);
  const auto tensors = testing::random_tensors(14, 60, 900);
  const auto result = f.send(tensors);
  EXPECT_FALSE(result.ok);
  EXPECT_TRUE(f.comm.aborted());
  ASSERT_FALSE(result.failures.empty());
  const EngineFailure* blamed = blame(result.failures);
  EXPECT_EQ(blamed->engine, "http://b:2");
  EXPECT_TRUE(blamed->unreachable);
  EXPECT_LT(result.buckets, plan_buckets(metas_of(tensors), 1024).size());
}

TEST(SendBuckets, BroadcastFailureIsReported) {
  SendFixture f;
  f.options.bucket_bytes = 1024;
  f.wire.fail_broadcast_at = 1;
  const auto result = f.send(testing::random_tensors(15, 30, 900));
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("bucket 1"), std::string::npos) << result.error;
  EXPECT_EQ(result.buckets, 1u);
}

}  // namespace
}  // namespace weightcast::sync::trainer

// What every backend must do beyond moving bytes: barrier, misuse, abort, timeouts, reuse.
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "tests/comm/conformance/conformance.h"
#include "tests/comm/conformance/conformance_support.h"

namespace weightcast::testing {

int behaviour_tests_anchor() {
  return 1;
}

namespace {

using comm::BroadcastOptions;
using comm::Communicator;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

BroadcastOptions bcast(void* buf, std::size_t bytes, int root, const BackendSpec& spec) {
  BroadcastOptions b;
  b.buffer = buf;
  b.bytes = bytes;
  b.root = root;
  b.memory = spec.memory;
  return b;
}

std::string test_label(const BackendSpec& spec) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return spec.name + "/" + info->name();
}

// Runs `body(rank, communicator)` on `world` ranks of a fresh group of the backend (a store of its
// own for the test), and fails the test on any rank's error. Where the backend cannot run `world`
// ranks here, it skips the test instead, and runs nothing.
template <typename Body>
void run_group(const BackendSpec& spec, int world, Body body) {
  const std::string why = spec.skip_reason ? spec.skip_reason(world) : "";
  if (!why.empty()) GTEST_SKIP() << why;
  auto store = case_store(test_label(spec));
  auto errors = run_ranks(world, [&](int rank) {
    auto c = spec.create(rank_options(spec, store, rank, world));
    body(rank, *c);
  });
  expect_no_rank_errors(errors);
}

// Two ranks: rank 0, the root, joins and then stays silent until rank 1's `receive` has returned,
// so only abort() or a deadline can end a broadcast rank 1 waits in.
template <typename Receive>
void with_silent_root(const BackendSpec& spec, Receive receive) {
  std::promise<void> receiver_done;
  auto done = receiver_done.get_future().share();
  run_group(spec, 2, [&](int rank, Communicator& c) {
    if (rank == 0) {
      if (done.wait_for(kConformanceTimeout) != std::future_status::ready) {
        throw std::runtime_error("receiver never finished");
      }
      return;
    }
    receive(c);
    receiver_done.set_value();
  });
}

}  // namespace

// No rank leaves the barrier before the last one has entered it, and it can be reused.
TEST_P(CommBehaviourConformance, BarrierWaitsForTheLastRank) {
  const BackendSpec& spec = *GetParam().backend;
  constexpr int kWorld = 3;
  std::atomic<int> entered{0};
  run_group(spec, kWorld, [&](int rank, Communicator& c) {
    for (int round = 1; round <= 2; ++round) {
      // The last rank dawdles: a barrier that does not wait lets the others see it missing.
      if (rank == kWorld - 1) std::this_thread::sleep_for(milliseconds(100));
      entered.fetch_add(1);
      c.barrier(kConformanceTimeout);
      const int seen = entered.load();
      if (seen < round * kWorld) {
        throw std::runtime_error("left barrier round " + std::to_string(round) + " after only " +
                                 std::to_string(seen) + " entries");
      }
      c.barrier(kConformanceTimeout);  // nobody starts the next round before all have checked
    }
  });
}

// Misuse throws EnforceError on the calling rank and leaves the communicator usable.
TEST_P(CommBehaviourConformance, MisuseIsEnforceErrorAndKeepsTheGroup) {
  const BackendSpec& spec = *GetParam().backend;
  constexpr int kWorld = 2;
  run_group(spec, kWorld, [&](int, Communicator& c) {
    RankBuffer buf(spec, 64);
    buf.upload(random_bytes(64, seed_of(test_label(spec))));
    EXPECT_THROW(c.broadcast(bcast(buf.get(), 64, -1, spec)), comm::EnforceError);
    EXPECT_THROW(c.broadcast(bcast(buf.get(), 64, kWorld, spec)), comm::EnforceError);
    EXPECT_THROW(c.broadcast(bcast(nullptr, 64, 0, spec)), comm::EnforceError);
    auto zero_timeout = bcast(buf.get(), 64, 0, spec);
    zero_timeout.timeout = milliseconds(0);
    EXPECT_THROW(c.broadcast(zero_timeout), comm::EnforceError);
    EXPECT_FALSE(c.aborted());
    c.broadcast(bcast(buf.get(), 64, 0, spec));  // still a working group
  });
}

// After abort() (twice: idempotent) every call throws at once.
TEST_P(CommBehaviourConformance, AbortThenCallsThrow) {
  const BackendSpec& spec = *GetParam().backend;
  constexpr int kWorld = 2;
  run_group(spec, kWorld, [&](int, Communicator& c) {
    RankBuffer buf(spec, 16);
    c.abort();
    c.abort();
    EXPECT_TRUE(c.aborted());
    EXPECT_THROW(c.broadcast(bcast(buf.get(), 16, 0, spec)), comm::Error);
    EXPECT_THROW(c.barrier(milliseconds(1000)), comm::Error);
  });
}

// abort() from another thread wakes a broadcast blocked on a root that never sends.
TEST_P(CommBehaviourConformance, AbortWakesABlockedBroadcast) {
  const BackendSpec& spec = *GetParam().backend;
  with_silent_root(spec, [&](Communicator& c) {
    RankBuffer buf(spec, 4096);
    std::thread watchdog([&] {
      std::this_thread::sleep_for(milliseconds(200));
      c.abort();
    });
    const auto start = Clock::now();
    EXPECT_THROW(c.broadcast(bcast(buf.get(), 4096, 0, spec)), comm::Error);
    const auto waited = Clock::now() - start;
    watchdog.join();
    EXPECT_TRUE(c.aborted());
    EXPECT_LT(waited, kConformanceTimeout / 2) << "abort() did not wake the broadcast";
  });
}

// A broadcast whose root never sends ends with TimeoutError near its deadline; the communicator
// is then aborted and the next call throws the same kind at once.
TEST_P(CommBehaviourConformance, TimeoutIsTypedAndAborts) {
  const BackendSpec& spec = *GetParam().backend;
  constexpr milliseconds kTimeout{300};
  with_silent_root(spec, [&](Communicator& c) {
    RankBuffer buf(spec, 4096);
    auto b = bcast(buf.get(), 4096, 0, spec);
    b.timeout = kTimeout;
    const auto start = Clock::now();
    EXPECT_THROW(c.broadcast(b), comm::TimeoutError);
    const auto waited = Clock::now() - start;
    EXPECT_TRUE(c.aborted());
    EXPECT_THROW(c.broadcast(b), comm::TimeoutError);
    EXPECT_GE(waited, kTimeout / 2) << "gave up long before the deadline";
    EXPECT_LT(waited, kConformanceTimeout / 2) << "ignored the per-call timeout";
  });
}

// One communicator carries many collectives in a row, with changing roots and sizes.
TEST_P(CommBehaviourConformance, SequentialBroadcastsWithChangingRoots) {
  const BackendSpec& spec = *GetParam().backend;
  constexpr int kWorld = 3;
  const std::string label = test_label(spec);
  const std::vector<std::size_t> sizes = {kManyChunksBytes, 1, 4093, 0, 2 * kManyChunksBytes, 7};
  run_group(spec, kWorld, [&](int rank, Communicator& c) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const int root = static_cast<int>(i % kWorld);
      const auto want = random_bytes(sizes[i], seed_of(label + std::to_string(i)));
      RankBuffer buf(spec, sizes[i]);
      auto init = want;
      if (rank != root) {
        for (auto& b : init) b = static_cast<std::uint8_t>(~b);
      }
      buf.upload(init);
      c.broadcast(bcast(sizes[i] == 0 ? nullptr : buf.get(), sizes[i], root, spec));
      const long at = first_mismatch(buf.download(), want);
      if (at != -1) {
        throw std::runtime_error("broadcast " + std::to_string(i) + " (root " +
                                 std::to_string(root) + ") differs at byte " + std::to_string(at));
      }
    }
  });
}

}  // namespace weightcast::testing

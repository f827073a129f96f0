// Gloo-specific behaviour: memory kinds, bind errors, rendezvous deadline, the stock broadcast.
#include "comm/gloo/gloo_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "tests/comm/gloo/gloo_group.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

using testing::fresh_store;
using testing::options;
using testing::pattern;
using testing::with_group;

TEST(GlooCommunicator, RefusesCudaMemoryNamingTheKind) {
  auto c = create_gloo_communicator(options(fresh_store("cuda"), 0, 1));
  std::vector<std::uint8_t> buf(8);
  BroadcastOptions b;
  b.buffer = buf.data();
  b.bytes = buf.size();
  b.memory = MemoryKind::kCuda;
  try {
    c->broadcast(b);
    FAIL() << "a CUDA buffer was accepted";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("host memory only"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->broadcast_stock(b), EnforceError);
  EXPECT_FALSE(c->aborted());
  EXPECT_EQ(c->backend(), "gloo");
}

TEST(GlooCommunicator, UnbindableAddressIsConfigError) {
  auto o = options(fresh_store("bind"), 0, 1);
  o.gloo.bind_address = "192.0.2.1";  // TEST-NET-1: never a local address
  EXPECT_THROW(create_gloo_communicator(o), ConfigError);
  o.gloo.bind_address = "";
  EXPECT_THROW(create_gloo_communicator(o), ConfigError);
}

TEST(GlooCommunicator, BadOptionsAreEnforceErrors) {
  auto o = options(fresh_store("opts"), 2, 2);
  EXPECT_THROW(create_gloo_communicator(o), EnforceError);
  o = options(nullptr, 0, 1);
  EXPECT_THROW(create_gloo_communicator(o), EnforceError);
  o = options(fresh_store("opts2"), 0, 1);
  o.gloo.chain.chunk_bytes = 0;
  EXPECT_THROW(create_gloo_communicator(o), EnforceError);
}

// Ranks 0..2 of a group of 4 rendezvous; rank 3 never comes. Each must give up with a
// TimeoutError that names the missing rank's key, close to the deadline.
TEST(GlooCommunicator, MissingRankIsTimeoutErrorNearTheDeadline) {
  constexpr milliseconds kTimeout{800};
  auto store = fresh_store("missing");
  std::vector<std::string> what(3);
  std::vector<Clock::duration> took(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const auto start = Clock::now();
      try {
        create_gloo_communicator(options(store, r, 4, kTimeout));
        what[static_cast<std::size_t>(r)] = "joined without rank 3";
      } catch (const TimeoutError& e) {
        what[static_cast<std::size_t>(r)] = std::string("TimeoutError: ") + e.what();
      } catch (const std::exception& e) {
        what[static_cast<std::size_t>(r)] = std::string("other: ") + e.what();
      }
      took[static_cast<std::size_t>(r)] = Clock::now() - start;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    const auto& w = what[static_cast<std::size_t>(r)];
    EXPECT_EQ(w.rfind("TimeoutError: ", 0), 0u) << "rank " << r << ": " << w;
    EXPECT_NE(w.find("[3]"), std::string::npos) << "should name rank 3's key: " << w;
    EXPECT_GE(took[static_cast<std::size_t>(r)], kTimeout / 2);
    EXPECT_LE(took[static_cast<std::size_t>(r)], weightcast::testing::late_bound(kTimeout));
  }
}

// The stock one-to-all broadcast and the chain give the same bytes, for every root.
TEST(GlooCommunicator, StockBroadcastMatchesTheChain) {
  constexpr int kSize = 4;
  constexpr std::size_t kBytes = 5 * 1000 + 321;
  with_group(kSize, "stock", [&](int rank, GlooCommunicator& c) {
    for (int root = 0; root < kSize; ++root) {
      const auto want = pattern(kBytes, 1000 + static_cast<std::uint64_t>(root));
      std::vector<std::uint8_t> chain(kBytes, 0), stock(kBytes, 0xff);
      if (rank == root) chain = stock = want;
      BroadcastOptions b;
      b.bytes = kBytes;
      b.root = root;
      b.buffer = chain.data();
      c.broadcast(b);
      b.buffer = stock.data();
      c.broadcast_stock(b);
      ASSERT_EQ(chain, want) << "chain, rank " << rank << " root " << root;
      ASSERT_EQ(stock, chain) << "stock, rank " << rank << " root " << root;
    }
    c.barrier(milliseconds(20000));
  });
}

// A barrier that cannot complete (one rank never calls it) times out and aborts.
TEST(GlooCommunicator, BarrierTimeoutIsTypedAndAborts) {
  std::atomic<bool> done{false};
  with_group(2, "barrier-timeout", [&](int rank, GlooCommunicator& c) {
    if (rank == 0) {
      while (!done.load()) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    EXPECT_THROW(c.barrier(milliseconds(200)), TimeoutError);
    EXPECT_TRUE(c.aborted());
    EXPECT_THROW(c.barrier(milliseconds(200)), TimeoutError);
    done.store(true);
  });
}

// A peer that has destroyed its communicator is gone: a broadcast that needs it (to receive
// from, or to send to) fails promptly with a PeerError naming it; Gloo alone would wait for the
// deadline when the failed connection is the one it is reading from.
TEST(GlooCommunicator, BroadcastNeedingAPeerThatLeftIsPeerErrorNamingIt) {
  constexpr milliseconds kTimeout{20000};
  auto store = fresh_store("left");
  std::vector<std::unique_ptr<GlooCommunicator>> c(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        c[static_cast<std::size_t>(r)] = create_gloo_communicator(options(store, r, 3, kTimeout));
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(c[0] && c[1] && c[2]);
  c[0].reset();  // rank 0 leaves

  std::vector<std::uint8_t> buf(3000, 7);
  BroadcastOptions o;
  o.buffer = buf.data();
  o.bytes = buf.size();
  // Rank 1 receives from root 0 (chain 0 -> 1 -> 2); rank 2 sends to rank 0 as root 2
  // (chain 2 -> 0 -> 1). Each needs rank 0 only.
  for (int rank : {1, 2}) {
    o.root = rank == 1 ? 0 : 2;
    const auto start = Clock::now();
    try {
      c[static_cast<std::size_t>(rank)]->broadcast(o);
      ADD_FAILURE() << "rank " << rank << ": a broadcast needing a departed rank succeeded";
    } catch (const PeerError& e) {
      EXPECT_EQ(e.peer(), "rank 0") << e.what();
    }
    EXPECT_LT(Clock::now() - start, kTimeout / 2) << "rank " << rank << " waited for the deadline";
    EXPECT_TRUE(c[static_cast<std::size_t>(rank)]->aborted());
  }
}

}  // namespace
}  // namespace weightcast::comm

// The Gloo chain's eager ring (comm/algorithms/eager_ring.h): broadcasts up to eager_max_bytes go
// down one TCP connection per rank, larger ones over Gloo unbound buffers. Both must give the
// root's bytes in any order of sizes and roots; members that disagree must fail with a message
// naming both sides, never hang or mix streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "comm/gloo/gloo_communicator.h"
#include "tests/comm/gloo/gloo_group.h"

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;
using testing::fresh_store;
using testing::options;
using testing::pattern;
using testing::with_group;

constexpr std::size_t kThreshold = 4096;

// The whole of `buf`, from `root`.
BroadcastOptions bcast(std::vector<std::uint8_t>& buf, int root) {
  return {buf.data(), buf.size(), root, MemoryKind::kHost, {}, {}};
}

// Broadcasts each of `sizes` from each root in turn, on one communicator; every rank must end each
// one with the root's bytes.
void every_size_from_every_root(int rank, GlooCommunicator& c,
                                const std::vector<std::size_t>& sizes) {
  std::uint64_t seed = 1;
  for (int root = 0; root < c.size(); ++root) {
    for (std::size_t n : sizes) {
      const auto want = pattern(n, seed++);
      std::vector<std::uint8_t> buf(n, 0x5a);
      if (rank == root) buf = want;
      c.broadcast(bcast(buf, root));
      ASSERT_EQ(buf, want) << "rank " << rank << " root " << root << " bytes " << n;
    }
  }
}

// Sizes on both sides of the threshold, interleaved, from every root: the two transports take
// turns on one communicator and every rank ends with the root's bytes.
TEST(EagerRing, SizesAroundTheThresholdArriveWholeFromEveryRoot) {
  constexpr int kSize = 3;
  const std::vector<std::size_t> sizes = {1, kThreshold - 1, kThreshold, kThreshold + 1, 9000,
                                          0, 3 * kThreshold};
  with_group(
      kSize, "around",
      [&](int rank, GlooCommunicator& c) { every_size_from_every_root(rank, c, sizes); },
      [](CommOptions& o) { o.gloo.eager_ring.max_bytes = kThreshold; });
}

// A member with another threshold would wait on the other transport until the deadline; the
// group refuses it when it forms instead.
TEST(EagerRing, MemberWithAnotherThresholdIsConfigErrorNamingBothValues) {
  auto store = fresh_store("threshold");
  std::string rank1_error;
  bool rank0_failed = false;
  std::thread rank0([&] {
    try {
      create_gloo_communicator(options(store, 0, 2, milliseconds(2000)));
    } catch (const Error&) {
      rank0_failed = true;  // its peer left before the group was complete
    }
  });
  auto o = options(store, 1, 2, milliseconds(2000));
  o.gloo.eager_ring.max_bytes = 1u << 20;
  try {
    create_gloo_communicator(o);
  } catch (const ConfigError& e) {
    rank1_error = e.what();
  }
  rank0.join();
  EXPECT_NE(rank1_error.find("eager_max_bytes"), std::string::npos) << rank1_error;
  EXPECT_NE(rank1_error.find(std::to_string(CommOptions{}.gloo.eager_ring.max_bytes)),
            std::string::npos)
      << rank1_error;
  EXPECT_NE(rank1_error.find("1048576"), std::string::npos) << rank1_error;
  EXPECT_TRUE(rank0_failed);
}

// The root broadcasts 100 bytes, the others expect 200: the first receiver reads the header and
// fails naming both, before any byte reaches its buffer; the last one learns from the closed
// connection at once. The root's bytes left eagerly, so its call returns.
TEST(EagerRing, RanksDisagreeingOnTheSizeFailNamingBothSides) {
  constexpr milliseconds kTimeout{20000};
  std::vector<std::string> what(3);
  const auto start = std::chrono::steady_clock::now();
  with_group(3, "disagree", [&](int rank, GlooCommunicator& c) {
    std::vector<std::uint8_t> buf(rank == 0 ? 100 : 200, 7);
    try {
      c.broadcast(bcast(buf, 0));
      what[static_cast<std::size_t>(rank)] = "ok";
    } catch (const PeerError& e) {
      what[static_cast<std::size_t>(rank)] =
          std::string("PeerError(") + e.peer() + "): " + e.what();
      EXPECT_EQ(buf, std::vector<std::uint8_t>(200, 7)) << "rank " << rank << " buffer touched";
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, kTimeout / 2);
  EXPECT_EQ(what[0], "ok");
  EXPECT_EQ(what[1].rfind("PeerError(rank 0)", 0), 0u) << what[1];
  EXPECT_NE(what[1].find("sends 100 bytes from root 0"), std::string::npos) << what[1];
  EXPECT_NE(what[1].find("expects 200 bytes from root 0"), std::string::npos) << what[1];
  EXPECT_EQ(what[2].rfind("PeerError(rank 1)", 0), 0u) << what[2];
}

// Ranks as threads of one process are members of one host: the group agrees on single copy, and
// sizes below the eager threshold (sockets), between it and the single-copy minimum (Gloo chain)
// and from the minimum up, also above the eager threshold (single copy), all arrive whole.
TEST(SingleCopy, AgreedOnOneHostAndEveryPathDeliversFromEveryRoot) {
  constexpr int kSize = 3;
  const std::vector<std::size_t> sizes = {1,      kThreshold, kThreshold + 1,    2 * kThreshold,
                                          100000, 0,          2 * kThreshold - 1};
  with_group(
      kSize, "copy-paths",
      [&](int rank, GlooCommunicator& c) {
        EXPECT_TRUE(c.single_copy()) << "rank " << rank;
        every_size_from_every_root(rank, c, sizes);
      },
      [](CommOptions& o) {
        o.gloo.eager_ring.max_bytes = kThreshold;
        o.gloo.single_copy.min_bytes = 2 * kThreshold;
      });
}

// on_received: a single-copy receiver reports its pieces as they land, in order, each already
// holding its final bytes; the sockets ring and the Gloo chain report the whole buffer once.
TEST(SingleCopy, ReceiversReportEachPieceAsItLands) {
  constexpr int kSize = 3;
  constexpr std::size_t kBytes = (5u << 20) + 12345;  // several pieces, the last one short
  for (const bool copy : {true, false}) {
    with_group(
        kSize, copy ? "copy-pieces" : "socket-pieces",
        [&](int rank, GlooCommunicator& c) {
          EXPECT_EQ(c.single_copy(), copy) << "rank " << rank;
          const auto want = pattern(kBytes, 7);
          std::vector<std::uint8_t> buf(kBytes, 0);
          if (rank == 0) buf = want;
          std::vector<std::pair<std::size_t, std::size_t>> ranges;
          bool held_final_bytes = true;
          BroadcastOptions b = bcast(buf, 0);
          b.on_received = [&](std::size_t offset, std::size_t bytes) {
            ranges.emplace_back(offset, bytes);
            held_final_bytes = held_final_bytes &&
                               std::equal(buf.begin() + static_cast<std::ptrdiff_t>(offset),
                                          buf.begin() + static_cast<std::ptrdiff_t>(offset + bytes),
                                          want.begin() + static_cast<std::ptrdiff_t>(offset));
          };
          c.broadcast(b);
          ASSERT_EQ(buf, want) << "rank " << rank;
          if (rank == 0) {
            EXPECT_TRUE(ranges.empty()) << "the root receives nothing";
            return;
          }
          EXPECT_TRUE(held_final_bytes) << "rank " << rank;
          std::size_t next = 0;
          for (const auto& [offset, bytes] : ranges) {
            EXPECT_EQ(offset, next) << "rank " << rank;
            EXPECT_GT(bytes, 0u);
            next = offset + bytes;
          }
          EXPECT_EQ(next, kBytes) << "rank " << rank;
          if (copy) {
            EXPECT_GE(ranges.size(), 5u) << "rank " << rank << ": pieces of at most 1 MiB";
          } else {
            EXPECT_EQ(ranges.size(), 1u) << "rank " << rank;
          }
        },
        [&](CommOptions& o) {
          o.gloo.eager_ring.max_bytes = kThreshold;
          o.gloo.single_copy.min_bytes = 2 * kThreshold;
          o.gloo.single_copy.enabled = copy;
        });
  }
}

// One member with single copy off keeps the whole group on sockets and Gloo: a group where some
// receivers copied and others waited for bytes on a socket would hang.
TEST(SingleCopy, OneMemberOptingOutKeepsTheWholeGroupOnSockets) {
  constexpr int kSize = 3;
  with_group(
      kSize, "copy-off",
      [&](int rank, GlooCommunicator& c) {
        EXPECT_FALSE(c.single_copy()) << "rank " << rank;
        for (std::size_t n : {std::size_t{3000}, std::size_t{50000}}) {
          const auto want = pattern(n, n);
          std::vector<std::uint8_t> buf(n, 0);
          if (rank == 2) buf = want;
          c.broadcast(bcast(buf, 2));
          ASSERT_EQ(buf, want) << "rank " << rank << " bytes " << n;
        }
      },
      [](CommOptions& o) {
        o.gloo.eager_ring.max_bytes = kThreshold;
        o.gloo.single_copy.min_bytes = 2 * kThreshold;
        if (o.rank == 1) o.gloo.single_copy.enabled = false;
      });
}

// The root gives up (its deadline passes) before the receiver has even started; the root's buffer
// stays allocated, so the receiver's copy succeeds, but the root no longer vouches for it: the
// receiver must fail naming the root rather than return bytes the root might have been changing.
TEST(SingleCopy, ReceiverRefusesACopyOnceTheRootHasLeft) {
  constexpr std::size_t kBytes = 64u << 10;
  std::atomic<bool> receiver_done{false};
  std::string root_error, receiver_error;
  with_group(
      2, "copy-left",
      [&](int rank, GlooCommunicator& c) {
        ASSERT_TRUE(c.single_copy());
        std::vector<std::uint8_t> buf(kBytes, rank == 0 ? 1 : 0);
        BroadcastOptions b = bcast(buf, 0);
        if (rank == 0) {
          b.timeout = milliseconds(200);
          try {
            c.broadcast(b);
          } catch (const TimeoutError& e) {
            root_error = e.what();
          }
          // Keep the buffer and the communicator until the receiver has tried.
          while (!receiver_done.load()) std::this_thread::sleep_for(milliseconds(5));
          return;
        }
        std::this_thread::sleep_for(milliseconds(600));
        try {
          c.broadcast(b);
        } catch (const PeerError& e) {
          receiver_error = std::string("PeerError(") + e.peer() + "): " + e.what();
        }
        receiver_done = true;
      },
      [](CommOptions& o) {
        o.gloo.eager_ring.max_bytes = kThreshold;
        o.gloo.single_copy.min_bytes = kThreshold;
      });
  EXPECT_FALSE(root_error.empty());
  EXPECT_EQ(receiver_error.rfind("PeerError(rank 0)", 0), 0u) << receiver_error;
  EXPECT_NE(receiver_error.find("left the broadcast"), std::string::npos) << receiver_error;
}

// Copies run down the chain: rank 2 copies out of rank 1's buffer, and rank 1 stays in the
// broadcast until rank 2 holds every byte. Rank 1 gives up first (its deadline passes while rank 2
// has not started); the root's bytes had all reached rank 1, so the root ends well, rank 1 fails
// naming rank 2, and rank 2, arriving late, refuses to copy out of a buffer rank 1 no longer
// vouches for.
TEST(SingleCopy, ReceiverRefusesACopyOnceItsPredecessorHasLeft) {
  constexpr std::size_t kBytes = 64u << 10;
  std::atomic<bool> rank2_done{false};
  std::string errors[3];
  with_group(
      3, "copy-mid-left",
      [&](int rank, GlooCommunicator& c) {
        ASSERT_TRUE(c.single_copy());
        const auto want = pattern(kBytes, 7);
        std::vector<std::uint8_t> buf(kBytes, 0);
        if (rank == 0) buf = want;
        BroadcastOptions b = bcast(buf, 0);
        if (rank == 1) b.timeout = milliseconds(200);
        if (rank == 2) std::this_thread::sleep_for(milliseconds(600));
        try {
          c.broadcast(b);
          if (rank != 2) {
            EXPECT_EQ(buf, want) << "rank " << rank;
          }
        } catch (const Error& e) {
          const auto* peer = dynamic_cast<const PeerError*>(&e);
          errors[rank] = std::string(peer ? "PeerError(" + peer->peer() + "): " : "") + e.what();
        }
        if (rank == 2) rank2_done = true;
        // Rank 1 keeps its buffer and the communicator until rank 2 has tried.
        while (!rank2_done.load()) std::this_thread::sleep_for(milliseconds(5));
      },
      [](CommOptions& o) {
        o.gloo.eager_ring.max_bytes = kThreshold;
        o.gloo.single_copy.min_bytes = kThreshold;
      });
  EXPECT_TRUE(errors[0].empty()) << errors[0];
  EXPECT_NE(errors[1].find("rank 2"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2].rfind("PeerError(rank 1)", 0), 0u) << errors[2];
  EXPECT_NE(errors[2].find("rank 1 left the broadcast"), std::string::npos) << errors[2];
}

}  // namespace
}  // namespace weightcast::comm

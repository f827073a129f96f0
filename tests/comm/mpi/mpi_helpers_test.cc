// MPI helpers under mpirun -np 4: every rank runs every test (see mpi_test_main.cc).
#include "comm/mpi/mpi_helpers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "tests/comm/mpi/mpi_test_env.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm::mpi::testing {
namespace {

using std::chrono::milliseconds;

Deadline generous() {
  return deadline_after(milliseconds(20000));
}

int world_rank() {
  return guard().world_rank();
}

// Distinct sizes per world rank, one of them empty, one past the eager limits of MPI's
// transports so the rendezvous path is taken too.
std::size_t shard_bytes(int world_rank) {
  static constexpr std::size_t kBytes[kWorldSize] = {1000, 0, 200000, 17};
  return kBytes[world_rank];
}

std::vector<std::byte> make_shard(int world_rank) {
  std::vector<std::byte> shard(shard_bytes(world_rank));
  for (std::size_t i = 0; i < shard.size(); ++i) {
    shard[i] =
        static_cast<std::byte>((i * 131 + static_cast<std::size_t>(world_rank) * 7 + 1) & 0xff);
  }
  return shard;
}

void expect_block(const GatheredBytes& got, int rank_in_comm, int from_world_rank) {
  const std::vector<std::byte> want = make_shard(from_world_rank);
  const auto block = got.block(rank_in_comm);
  ASSERT_EQ(block.size(), want.size()) << "block of world rank " << from_world_rank;
  EXPECT_TRUE(std::equal(block.begin(), block.end(), want.begin()))
      << "bytes of world rank " << from_world_rank << " differ";
}

struct Shape {
  int tp;
  int pp;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "tp" << s.tp << " pp" << s.pp;
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const int dp = kWorldSize / (info.param.tp * info.param.pp);
  return "tp" + std::to_string(info.param.tp) + "_pp" + std::to_string(info.param.pp) + "_dp" +
         std::to_string(dp);
}

class GroupsTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GroupsTest, SubCommunicatorsMatchTopology) {
  const Topology topo(world_rank(), guard().world_size(), GetParam().tp, GetParam().pp);
  const Comm tp = tp_group(topo, MPI_COMM_WORLD, generous());
  const Comm dp = dp_group(topo, MPI_COMM_WORLD, generous());
  const Comm stage = stage_group(topo, MPI_COMM_WORLD, generous());

  ASSERT_EQ(tp.size(), topo.tp_size());
  ASSERT_EQ(dp.size(), topo.dp_size());
  ASSERT_EQ(stage.size(), topo.stage_size());
  EXPECT_EQ(tp.rank(), topo.tp_rank());
  EXPECT_EQ(dp.rank(), topo.dp_rank());
  EXPECT_EQ(stage.rank(), topo.rank_in_stage());

  std::vector<int> want_tp, want_dp, want_stage;
  for (int t = 0; t < topo.tp_size(); ++t) {
    want_tp.push_back(topo.world_rank_of(t, topo.dp_rank(), topo.pp_rank()));
  }
  for (int d = 0; d < topo.dp_size(); ++d) {
    want_dp.push_back(topo.world_rank_of(topo.tp_rank(), d, topo.pp_rank()));
  }
  for (int d = 0; d < topo.dp_size(); ++d) {
    for (int t = 0; t < topo.tp_size(); ++t) {
      want_stage.push_back(topo.world_rank_of(t, d, topo.pp_rank()));
    }
  }
  EXPECT_EQ(tp.world_ranks(), want_tp);
  EXPECT_EQ(dp.world_ranks(), want_dp);
  EXPECT_EQ(stage.world_ranks(), want_stage);
  EXPECT_EQ(stage.world_ranks().front(), topo.stage_source());
}

TEST_P(GroupsTest, StageSourceReceivesEveryShardIntact) {
  const Topology topo(world_rank(), guard().world_size(), GetParam().tp, GetParam().pp);
  const Comm stage = stage_group(topo, MPI_COMM_WORLD, generous());
  const GatheredBytes got = gatherv_bytes(stage.get(), 0, make_shard(world_rank()), generous());
  if (!topo.is_stage_source()) {
    EXPECT_EQ(got.size(), 0);
    EXPECT_TRUE(got.data.empty());
    return;
  }
  ASSERT_EQ(got.size(), topo.stage_size());
  const std::vector<int> members = stage.world_ranks();
  std::size_t total = 0;
  for (int r = 0; r < got.size(); ++r) {
    expect_block(got, r, members[static_cast<std::size_t>(r)]);
    total += shard_bytes(members[static_cast<std::size_t>(r)]);
  }
  EXPECT_EQ(got.data.size(), total);
}

TEST_P(GroupsTest, StageSourceSharesAnAddress) {
  const Topology topo(world_rank(), guard().world_size(), GetParam().tp, GetParam().pp);
  const Comm stage = stage_group(topo, MPI_COMM_WORLD, generous());
  const std::string address = "127.0.0.1:" + std::to_string(40000 + topo.pp_rank());
  const std::string sent = topo.is_stage_source() ? address : "ignored on non-roots";
  EXPECT_EQ(broadcast_string(stage.get(), 0, sent, generous()), address);
  EXPECT_EQ(broadcast_string(stage.get(), 0, topo.is_stage_source() ? "" : "x", generous()), "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupsTest,
                         ::testing::Values(Shape{2, 2}, Shape{1, 2}, Shape{2, 1}, Shape{1, 4},
                                           Shape{4, 1}, Shape{1, 1}),
                         shape_name);

TEST(Gatherv, EveryWorldRankCanBeRoot) {
  for (int root = 0; root < kWorldSize; ++root) {
    const GatheredBytes got =
        gatherv_bytes(MPI_COMM_WORLD, root, make_shard(world_rank()), generous());
    if (world_rank() != root) {
      EXPECT_EQ(got.size(), 0) << "root " << root;
      continue;
    }
    ASSERT_EQ(got.size(), kWorldSize);
    for (int r = 0; r < kWorldSize; ++r) expect_block(got, r, r);
  }
}

TEST(Gatherv, AllBlocksEmpty) {
  const GatheredBytes got = gatherv_bytes(MPI_COMM_WORLD, 1, {}, generous());
  if (world_rank() == 1) {
    ASSERT_EQ(got.size(), kWorldSize);
    EXPECT_TRUE(got.data.empty());
    for (int r = 0; r < kWorldSize; ++r) EXPECT_TRUE(got.block(r).empty());
  }
}

// A root that passes its last result back receives into the same memory, which only grows:
// blocks stay right when a later gather brings fewer bytes than an earlier one.
TEST(Gatherv, RootReusesItsBufferAcrossCalls) {
  const int root = 2;
  GatheredBytes kept;
  const std::byte* first = nullptr;
  for (int round = 0; round < 3; ++round) {
    // Round 1 sends nothing from odd ranks: fewer bytes than round 0 into the same buffer.
    std::vector<std::byte> send = make_shard(world_rank());
    if (round == 1 && world_rank() % 2 == 1) send.clear();
    kept = gatherv_bytes(MPI_COMM_WORLD, root, std::move(send), generous(), std::move(kept));
    if (world_rank() != root) {
      EXPECT_EQ(kept.size(), 0);
      continue;
    }
    ASSERT_EQ(kept.size(), kWorldSize);
    for (int r = 0; r < kWorldSize; ++r) {
      if (round == 1 && r % 2 == 1) {
        EXPECT_TRUE(kept.block(r).empty()) << "round " << round << " rank " << r;
      } else {
        expect_block(kept, r, r);
      }
    }
    if (round == 0) first = kept.data.data();
    EXPECT_EQ(kept.data.data(), first) << "round " << round << " reallocated the buffer";
  }
}

// A block sent in place out of a larger buffer: the gather holds the owner, so the caller may
// drop its own reference before the collective ends.
TEST(Gatherv, SendsASliceInPlace) {
  auto whole = std::make_shared<std::vector<std::byte>>(make_shard(world_rank()));
  const std::size_t skip = whole->size() / 3;
  const std::span<const std::byte> slice = std::span<const std::byte>(*whole).subspan(skip);
  const std::vector<std::byte> want(slice.begin(), slice.end());
  std::shared_ptr<const void> owner = std::move(whole);
  const GatheredBytes got = gatherv_bytes(MPI_COMM_WORLD, 0, std::move(owner), slice, generous());
  const std::vector<std::vector<std::byte>> all = [] {
    std::vector<std::vector<std::byte>> v;
    for (int r = 0; r < kWorldSize; ++r) {
      auto shard = make_shard(r);
      v.emplace_back(shard.begin() + static_cast<std::ptrdiff_t>(shard.size() / 3), shard.end());
    }
    return v;
  }();
  EXPECT_EQ(all[static_cast<std::size_t>(world_rank())], want);
  if (world_rank() != 0) return;
  ASSERT_EQ(got.size(), kWorldSize);
  for (int r = 0; r < kWorldSize; ++r) {
    const auto block = got.block(r);
    const auto& expected = all[static_cast<std::size_t>(r)];
    ASSERT_EQ(block.size(), expected.size()) << "rank " << r;
    EXPECT_TRUE(std::equal(block.begin(), block.end(), expected.begin())) << "rank " << r;
  }
}

TEST(Misuse, ABlockWithoutAnOwnerIsRejected) {
  const std::vector<std::byte> bytes(8);
  EXPECT_THROW(
      gatherv_bytes(MPI_COMM_SELF, 0, nullptr, std::span<const std::byte>(bytes), generous()),
      EnforceError);
}

TEST(Misuse, IsRejectedBeforeAnythingIsPosted) {
  // On MPI_COMM_SELF, so a rejected call cannot leave peers waiting.
  EXPECT_THROW(gatherv_bytes(MPI_COMM_SELF, 1, {}, generous()), EnforceError);
  EXPECT_THROW(gatherv_bytes(MPI_COMM_SELF, -1, {}, generous()), EnforceError);
  EXPECT_THROW(broadcast_string(MPI_COMM_SELF, 1, "a", generous()), EnforceError);
  EXPECT_THROW(broadcast_string(MPI_COMM_SELF, 0, std::string(kMaxBroadcastStringBytes + 1, 'a'),
                                generous()),
               EnforceError);
  EXPECT_THROW(barrier(MPI_COMM_NULL, generous()), EnforceError);
  const Topology wrong_world(0, 2, 1, 1);  // this process is not rank 0 of a world of 2
  EXPECT_THROW(tp_group(wrong_world, MPI_COMM_WORLD, generous()), EnforceError);
  EXPECT_EQ(stranded_operations(), 0u);
}

// mpirun puts the 4 ranks on this one host: no communicator spans hosts, and every rank agrees.
// (Several hosts: weightcast-bench hosts --trainer-ep, tests/netns/bench_hosts_test.cc.)
TEST(SpansHosts, OneHostsRanksDoNot) {
  EXPECT_FALSE(spans_hosts(MPI_COMM_WORLD, generous()));
  const Comm pair = split(MPI_COMM_WORLD, world_rank() / 2, world_rank(), generous());
  EXPECT_FALSE(spans_hosts(pair.get(), generous()));
}

TEST(Barrier, WaitsForTheLastRank) {
  barrier(MPI_COMM_WORLD, generous());
  constexpr auto kLate = milliseconds(400);
  const auto start = Clock::now();
  if (world_rank() == 2) std::this_thread::sleep_for(kLate);
  barrier(MPI_COMM_WORLD, generous());
  // Half the delay: ranks leave the first barrier at slightly different times.
  EXPECT_GE(Clock::now() - start, kLate / 2);
}

TEST(Guard, SecondGuardNeitherInitializesNorFinalizes) {
  {
    const MpiGuard inner;
    EXPECT_FALSE(inner.owns_mpi());
    EXPECT_TRUE(guard().owns_mpi());
    EXPECT_EQ(inner.world_rank(), world_rank());
    EXPECT_EQ(inner.world_size(), kWorldSize);
    EXPECT_EQ(inner.thread_level(), guard().thread_level());
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
  EXPECT_GE(guard().thread_level(), MPI_THREAD_SINGLE);
  EXPECT_LE(guard().thread_level(), MPI_THREAD_MULTIPLE);
  barrier(MPI_COMM_WORLD, generous());
}

// The last rank arrives long after the others' deadline: they get TimeoutError, and once it
// does arrive the abandoned operations still complete, so MPI shuts down cleanly.
constexpr int kLateRank = kWorldSize - 1;
constexpr milliseconds kShortDeadline(1000);
constexpr milliseconds kLateBy(3000);  // past 2x the deadline: the root has decided by then

void finish_stranded_operations() {
  barrier(MPI_COMM_WORLD, generous());  // drives the stranded operations while it polls
  EXPECT_EQ(drain_stranded(generous()), 0u);
  EXPECT_EQ(stranded_operations(), 0u);
}

TEST(Timeout, GathervRootGetsTimeoutErrorWhenOneRankNeverCalls) {
  const Comm comm = duplicate(MPI_COMM_WORLD, generous());
  const int rank = world_rank();
  if (rank == kLateRank) {
    std::this_thread::sleep_for(kLateBy);
    EXPECT_EQ(gatherv_bytes(comm.get(), 0, make_shard(rank), generous()).size(), 0);
  } else {
    const auto start = Clock::now();
    try {
      (void)gatherv_bytes(comm.get(), 0, make_shard(rank), deadline_after(kShortDeadline));
      EXPECT_NE(rank, 0) << "the root returned before rank " << kLateRank << " sent anything";
    } catch (const TimeoutError& e) {
      const auto waited = Clock::now() - start;
      EXPECT_GE(waited, kShortDeadline / 2);
      EXPECT_LE(waited, weightcast::testing::late_bound(kShortDeadline));
      const std::string what = e.what();
      EXPECT_NE(what.find("gatherv_bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("size 4"), std::string::npos) << what;
      EXPECT_NE(what.find("MPI_Abort"), std::string::npos) << what;
      EXPECT_GE(stranded_operations(), 1u);
    }
    // Non-roots may finish early (their blocks are sent) or time out too, depending on the
    // gather algorithm; only the root must time out.
  }
  finish_stranded_operations();
}

TEST(Timeout, BarrierTimesOutOnEveryRankThatCame) {
  const Comm comm = duplicate(MPI_COMM_WORLD, generous());
  if (world_rank() == kLateRank) {
    std::this_thread::sleep_for(kLateBy);
    barrier(comm.get(), generous());
  } else {
    const auto start = Clock::now();
    EXPECT_THROW(barrier(comm.get(), deadline_after(kShortDeadline)), TimeoutError);
    EXPECT_GE(Clock::now() - start, kShortDeadline / 2);
    EXPECT_LE(Clock::now() - start, weightcast::testing::late_bound(kShortDeadline));
  }
  finish_stranded_operations();
}

// Run only by the ctest that checks a failing rank fails the whole mpirun.
TEST(DISABLED_FailureReporting, OneRankFails) {
  barrier(MPI_COMM_WORLD, generous());
  if (world_rank() == 2) ADD_FAILURE() << "deliberate failure on rank 2";
}

}  // namespace
}  // namespace weightcast::comm::mpi::testing

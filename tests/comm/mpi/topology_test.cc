// Topology is pure arithmetic: checked here for every rank of several grids, without MPI.
#include "comm/mpi/topology.h"

#include <gtest/gtest.h>

#include <ostream>
#include <set>
#include <tuple>

#include "comm/errors.h"

namespace weightcast::comm::mpi {
namespace {

struct Shape {
  int tp;
  int pp;
  int dp;
};

// Keeps test names readable instead of a hex dump of the struct.
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "tp" << s.tp << " pp" << s.pp << " dp" << s.dp;
}

class MpiTopologyShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(MpiTopologyShapes, EveryRankMapsBackAndForth) {
  const Shape s = GetParam();
  const int world = s.tp * s.pp * s.dp;
  std::set<std::tuple<int, int, int>> seen;
  int sources = 0;
  for (int rank = 0; rank < world; ++rank) {
    const Topology topo(rank, world, s.tp, s.pp);
    EXPECT_EQ(topo.dp_size(), s.dp);
    EXPECT_EQ(topo.stage_size(), s.tp * s.dp);
    ASSERT_GE(topo.tp_rank(), 0);
    ASSERT_LT(topo.tp_rank(), s.tp);
    ASSERT_GE(topo.dp_rank(), 0);
    ASSERT_LT(topo.dp_rank(), s.dp);
    ASSERT_GE(topo.pp_rank(), 0);
    ASSERT_LT(topo.pp_rank(), s.pp);
    // Megatron's order, written out independently of the implementation.
    EXPECT_EQ(rank, topo.tp_rank() + s.tp * (topo.dp_rank() + s.dp * topo.pp_rank()));
    EXPECT_EQ(topo.world_rank_of(topo.tp_rank(), topo.dp_rank(), topo.pp_rank()), rank);
    EXPECT_TRUE(seen.emplace(topo.tp_rank(), topo.dp_rank(), topo.pp_rank()).second)
        << "two ranks share a grid cell, rank " << rank;
    EXPECT_EQ(topo.rank_in_stage(), rank - topo.pp_rank() * s.tp * s.dp);

    const int source = topo.stage_source();
    EXPECT_EQ(source, topo.pp_rank() * s.tp * s.dp);
    const Topology source_topo(source, world, s.tp, s.pp);
    EXPECT_TRUE(source_topo.is_stage_source());
    EXPECT_EQ(source_topo.pp_rank(), topo.pp_rank());
    EXPECT_EQ(source_topo.rank_in_stage(), 0);
    EXPECT_EQ(topo.is_stage_source(), rank == source);
    if (topo.is_stage_source()) ++sources;
  }
  EXPECT_EQ(static_cast<int>(seen.size()), world);
  EXPECT_EQ(sources, s.pp) << "one source per pipeline stage";
}

INSTANTIATE_TEST_SUITE_P(Grids, MpiTopologyShapes,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 1, 4}, Shape{2, 2, 1},
                                           Shape{1, 2, 2}, Shape{2, 1, 2}, Shape{4, 2, 3},
                                           Shape{3, 5, 2}, Shape{8, 4, 2}),
                         [](const ::testing::TestParamInfo<Shape>& param_info) {
                           return "tp" + std::to_string(param_info.param.tp) + "_pp" +
                                  std::to_string(param_info.param.pp) + "_dp" +
                                  std::to_string(param_info.param.dp);
                         });

TEST(MpiTopology, KnownRanksOfTp2Pp2Dp2) {
  // world 8: tp fastest, then dp, then pp.
  const Topology r5(5, 8, 2, 2);
  EXPECT_EQ(r5.tp_rank(), 1);
  EXPECT_EQ(r5.dp_rank(), 0);
  EXPECT_EQ(r5.pp_rank(), 1);
  EXPECT_EQ(r5.stage_source(), 4);
  EXPECT_EQ(r5.stage_source(0), 0);
  const Topology r6(6, 8, 2, 2);
  EXPECT_EQ(r6.tp_rank(), 0);
  EXPECT_EQ(r6.dp_rank(), 1);
  EXPECT_EQ(r6.pp_rank(), 1);
  EXPECT_FALSE(r6.is_stage_source());
}

TEST(MpiTopology, WorldNotDivisibleByGridNamesBothValues) {
  try {
    Topology(0, 6, 4, 1);
    FAIL() << "expected EnforceError";
  } catch (const EnforceError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("world size 6"), std::string::npos) << what;
    EXPECT_NE(what.find("4 * 1"), std::string::npos) << what;
  }
  EXPECT_THROW(Topology(0, 8, 3, 1), EnforceError);
  EXPECT_THROW(Topology(0, 8, 2, 3), EnforceError);
  EXPECT_THROW(Topology(0, 4, 8, 1), EnforceError);  // grid larger than the world
}

TEST(MpiTopology, BadSizesAndRanksAreRejected) {
  EXPECT_THROW(Topology(0, 4, 0, 1), EnforceError);
  EXPECT_THROW(Topology(0, 4, 1, 0), EnforceError);
  EXPECT_THROW(Topology(0, 4, -2, -2), EnforceError);
  EXPECT_THROW(Topology(0, 0, 1, 1), EnforceError);
  EXPECT_THROW(Topology(-1, 4, 1, 1), EnforceError);
  EXPECT_THROW(Topology(4, 4, 1, 1), EnforceError);
  EXPECT_THROW(Topology(0, 1 << 30, 1 << 20, 1 << 20), EnforceError);  // tp * pp overflows int
  const Topology topo(0, 4, 2, 2);
  EXPECT_THROW(topo.world_rank_of(2, 0, 0), EnforceError);
  EXPECT_THROW(topo.world_rank_of(0, 1, 0), EnforceError);
  EXPECT_THROW(topo.world_rank_of(0, 0, 2), EnforceError);
  EXPECT_THROW(topo.stage_source(-1), EnforceError);
}

}  // namespace
}  // namespace weightcast::comm::mpi

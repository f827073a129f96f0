// EngineSet: membership, epochs and the probe backoff of the elastic engine set, as plain
// bookkeeping (no engines involved).
#include "sync/trainer/engine_set.h"

#include <gtest/gtest.h>

#include "comm/errors.h"

namespace weightcast::sync::trainer {
namespace {

using Indices = std::vector<std::size_t>;

TEST(EngineSet, StartsWithEveryEngineCurrentAtEpochZero) {
  EngineSet set(3);
  EXPECT_EQ(set.members(), (Indices{0, 1, 2}));
  EXPECT_TRUE(set.dropped().empty());
  EXPECT_EQ(set.epoch(), 0u);
  for (std::size_t e = 0; e < 3; ++e) EXPECT_TRUE(set.current(e));
}

TEST(EngineSet, DropLeavesTheSetAndStartsANewEpoch) {
  EngineSet set(3);
  set.drop(1, /*step=*/5, "id-1");
  EXPECT_EQ(set.members(), (Indices{0, 2}));
  EXPECT_EQ(set.dropped(), (Indices{1}));
  EXPECT_EQ(set.epoch(), 1u);
  EXPECT_FALSE(set.member(1));
  EXPECT_FALSE(set.current(1));
  EXPECT_THROW(set.drop(1, 5), comm::EnforceError);
}

TEST(EngineSet, FirstProbeIsTheNextStepAndFailedProbesBackOffExponentially) {
  EngineSet set(2, /*max_backoff_steps=*/8);
  set.drop(0, 5);
  EXPECT_TRUE(set.due(5).empty());
  EXPECT_EQ(set.due(6), (Indices{0}));
  std::vector<int> probes;
  for (int step = 6; step <= 40; ++step) {
    if (set.due(step).empty()) continue;
    probes.push_back(step);
    set.probe_failed(0, step);
  }
  // Waits of 2, 4, 8, then capped at 8.
  EXPECT_EQ(probes, (std::vector<int>{6, 8, 12, 20, 28, 36}));
}

TEST(EngineSet, ReadmittedEngineIsAMemberButCurrentOnlyAfterACommit) {
  EngineSet set(3);
  set.drop(2, 3, "stale-id");
  EXPECT_EQ(set.readmit(2), "stale-id");
  EXPECT_EQ(set.epoch(), 2u);
  EXPECT_EQ(set.members(), (Indices{0, 1, 2}));
  EXPECT_FALSE(set.current(2));
  EXPECT_EQ(set.pending(), (Indices{2}));
  EXPECT_EQ(set.committed(), (Indices{2}));
  EXPECT_TRUE(set.current(2));
  EXPECT_TRUE(set.committed().empty());
}

TEST(EngineSet, AnEngineThatFailsAgainSoonAfterItsReadmissionWaitsLonger) {
  EngineSet set(2);
  set.drop(1, 10);
  EXPECT_EQ(set.next_probe(1), 11);
  set.readmit(1);
  set.drop(1, 12);  // failed again before a stable run
  EXPECT_EQ(set.next_probe(1), 14);
  set.readmit(1);
  set.drop(1, 15);
  EXPECT_EQ(set.next_probe(1), 19);
  // A stable run forgives the earlier drops.
  set.readmit(1);
  for (int i = 0; i < 4; ++i) set.committed();
  set.drop(1, 30);
  EXPECT_EQ(set.next_probe(1), 31);
}

TEST(EngineSet, PolicyParsesAndNamesItself) {
  EXPECT_EQ(parse_engine_failure_policy("drop"), EngineFailurePolicy::kDrop);
  EXPECT_EQ(parse_engine_failure_policy("fail"), EngineFailurePolicy::kFail);
  EXPECT_EQ(to_string(EngineFailurePolicy::kDrop), "drop");
  EXPECT_THROW(parse_engine_failure_policy("retry"), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer

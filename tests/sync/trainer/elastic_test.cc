// DistributedUpdater with the elastic engine set (EngineFailurePolicy::kDrop) against three fake
// engines: a failing engine is dropped and the update completes on the others under a new group
// epoch; a dropped engine that answers again is re-admitted with a full update (our stale session
// on it aborted by its id); probes back off; the default policy is unchanged; explicit versions.
#include <gtest/gtest.h>

#include "sync/trainer/updater.h"
#include "tests/sync/trainer/fakes.h"
#include "tests/sync/trainer/test_tensors.h"

namespace weightcast::sync::trainer {
namespace {

using testing::FakeEngine;
using testing::kA;
using testing::kB;
using testing::kC;

// Engine c's process is gone: nothing answers, health included.
void kill(FakeEngine& engine) {
  for (const char* route :
       {"GET /health", "GET /server_info", "POST /update_weights_from_distributed",
        "POST /abort_weight_update", "POST /continue_generation", "POST /pause_generation",
        "POST /destroy_weights_update_group"}) {
    engine.fail_route(route, 0);
  }
}

// Engines a and c with one rank, b with two; all are up when training starts.
struct Elastic : testing::FakeFleet {
  FakeEngine* a;
  FakeEngine* b;
  FakeEngine* c;

  explicit Elastic(EngineFailurePolicy policy = EngineFailurePolicy::kDrop)
      : FakeFleet({1, 2, 1}, options(policy)), a(engines[0]), b(engines[1]), c(engines[2]) {
    updater->connect();
  }

  static UpdaterOptions options(EngineFailurePolicy policy) {
    UpdaterOptions o;
    o.selector = Selector::kTarget;
    o.on_engine_failure = policy;
    return o;
  }

  int count(const std::string& event) {
    int n = 0;
    for (const auto& e : wire.snapshot()) n += e == event ? 1 : 0;
    return n;
  }
};

TEST(Elastic, FailedEngineIsDroppedAndTheUpdateCompletesOnTheOthers) {
  Elastic f;
  const auto tensors = testing::random_tensors(3, 20, 900);
  kill(*f.c);
  const auto report = f.updater->update(views(tensors));
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "1");
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_EQ(report.dropped[0].engine, kC);
  EXPECT_NE(report.dropped[0].why.find(kC), std::string::npos) << report.dropped[0].why;
  EXPECT_TRUE(report.degraded());
  EXPECT_EQ(report.out, std::vector<std::string>{kC});
  EXPECT_EQ(report.engines_current, 2u);
  EXPECT_EQ(f.a->committed(), testing::as_map(tensors));
  EXPECT_EQ(f.b->committed(), testing::as_map(tensors));
  EXPECT_EQ(f.a->version(), "1");
  // The redo ran on a group of a new epoch, sized without c: no stale member can join it.
  ASSERT_EQ(f.a->inits.size(), 2u);
  EXPECT_EQ(f.a->inits[0].group_name, "weightcast-pp_0");
  EXPECT_EQ(f.a->inits[1].group_name, "weightcast-pp_0-e1");
  EXPECT_EQ(f.a->inits[1].world_size, 4);
  EXPECT_EQ(f.b->inits[1].rank_offset, 2);
  const std::string line = membership_summary(report, 3);
  EXPECT_NE(
      line.find("engines current 2/3 dropped 1 readmitted 0 degraded: dropped " + std::string(kC)),
      std::string::npos)
      << line;
}

TEST(Elastic, DroppedEngineThatAnswersIsReadmittedWithAFullUpdate) {
  Elastic f;
  // c stops answering in the middle of the update, after it opened our session.
  for (const char* route :
       {"GET /health", "POST /update_weights_from_distributed", "POST /abort_weight_update",
        "POST /continue_generation", "POST /destroy_weights_update_group"}) {
    f.c->fail_route(route, 0);
  }
  ASSERT_TRUE(f.updater->update(views(testing::random_tensors(1, 20, 900))).ok);
  // c comes back still holding our session of update 1 (its abort never arrived).
  f.c->clear_failures();
  const auto tensors = testing::random_tensors(2, 20, 900);
  const auto report = f.updater->update(views(tensors));
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "2");
  EXPECT_EQ(report.readmitted, std::vector<std::string>{kC});
  EXPECT_TRUE(report.dropped.empty());
  EXPECT_FALSE(report.degraded());
  EXPECT_EQ(report.engines_current, 3u);
  EXPECT_EQ(f.c->committed(), testing::as_map(tensors));
  EXPECT_EQ(f.c->version(), "2");
  EXPECT_EQ(f.c->inits.back().group_name, "weightcast-pp_0-e2");
  // Its stale session was aborted (by its id) before our new begin.
  const auto events = f.wire.snapshot();
  const auto at = [&](const std::string& what) {
    for (std::size_t i = events.size(); i-- > 0;) {
      if (events[i] == what) return static_cast<int>(i);
    }
    return -1;
  };
  EXPECT_GE(at(std::string(kC) + " POST /abort_weight_update"), 0);
  EXPECT_LT(at(std::string(kC) + " POST /abort_weight_update"),
            at(std::string(kC) + " POST /begin_weight_update target"));
}

TEST(Elastic, AnEngineThatStaysDownIsProbedWithBackoffNotEveryUpdate) {
  Elastic f;
  kill(*f.c);
  for (int i = 0; i < 8; ++i) {
    const auto report = f.updater->update({});
    ASSERT_TRUE(report.ok) << report.error;
    EXPECT_EQ(report.out, std::vector<std::string>{kC});
  }
  // One /health when it failed (update 1), then probes at updates 2, 4, 8.
  EXPECT_EQ(f.count(std::string(kC) + " GET /health"), 4);
  EXPECT_EQ(f.a->version(), "8");
}

TEST(Elastic, TheLastEngineIsNeverDropped) {
  Elastic f;
  kill(*f.b);
  kill(*f.c);
  f.a->fail_route("POST /update_weights_from_distributed", 500);
  const auto report = f.updater->update(views(testing::random_tensors(1, 5, 900)));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(f.updater->members().size(), 1u);
  EXPECT_EQ(f.updater->members()[0]->url(), kA);
}

TEST(Elastic, DefaultPolicyFailsTheUpdateAndDropsNothing) {
  Elastic f(EngineFailurePolicy::kFail);
  kill(*f.c);
  const auto report = f.updater->update(views(testing::random_tensors(1, 5, 900)));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kC);
  EXPECT_TRUE(report.dropped.empty());
  EXPECT_EQ(f.updater->members().size(), 3u);
  EXPECT_EQ(f.a->version(), "0");  // the previous version, everywhere
}

TEST(Elastic, ExplicitVersionIsCommittedAndTheNumericDefaultContinuesFromIt) {
  Elastic f;
  auto report = f.updater->update({}, "7");
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(f.b->version(), "7");
  report = f.updater->update({});
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "8");
  report = f.updater->update({}, "policy-2026-a");
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(f.c->version(), "policy-2026-a");
}

TEST(Elastic, SessionTokenCarriesMembersAndEpoch) {
  Elastic f;
  kill(*f.b);
  ASSERT_TRUE(f.updater->update({}).ok);
  UpdateReport report;
  const auto session = f.updater->open_session(report);
  ASSERT_TRUE(session.has_value()) << report.error;
  const UpdateSession joined = join_session(session->token());
  EXPECT_EQ(joined.members(), (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(joined.epoch(), 1u);
  EXPECT_EQ(joined.session_id(1), session->session_id(1));
  EXPECT_EQ(joined.token(), session->token());
  EXPECT_THROW(join_session("target 3 a,b m1:0"), comm::BadRequestError);
  EXPECT_THROW(join_session("target 3 a m1:x"), comm::BadRequestError);
  f.updater->abort(report, "test over");
}

}  // namespace
}  // namespace weightcast::sync::trainer

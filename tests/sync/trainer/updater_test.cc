// DistributedUpdater orchestration against in-process fake engines and a fake data plane: the
// order of the steps, concurrency on all engines, the abort path and who it names, the selector
// checks, versions, and that every engine commits exactly the bytes that were sent.
#include "sync/trainer/updater.h"

#include <gtest/gtest.h>

#include "comm/errors.h"
#include "tests/sync/trainer/fakes.h"
#include "tests/sync/trainer/test_tensors.h"

namespace weightcast::sync::trainer {
namespace {

using testing::FakeEngine;
using testing::kA;
using testing::kB;

// Engine a with one rank, engine b with two.
struct Fixture : testing::FakeFleet {
  FakeEngine* a;
  FakeEngine* b;

  explicit Fixture(UpdaterOptions options = with_target())
      : FakeFleet({1, 2}, std::move(options)), a(engines[0]), b(engines[1]) {}

  static UpdaterOptions with_target() {
    UpdaterOptions o;
    o.selector = Selector::kTarget;
    return o;
  }
};

TEST(Updater, DeliversEveryTensorToEveryEngine) {
  Fixture f;
  const auto tensors = testing::random_tensors(1, 40, 900);
  const auto report = f.updater->update(views(tensors));
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "1");
  EXPECT_EQ(report.selector, Selector::kTarget);
  EXPECT_EQ(report.tensors, 40u);
  EXPECT_GT(report.buckets, 3u);
  EXPECT_EQ(f.a->committed(), testing::as_map(tensors));
  EXPECT_EQ(f.b->committed(), testing::as_map(tensors));
  EXPECT_EQ(f.a->version(), "1");
  EXPECT_EQ(f.b->version(), "1");
  for (const auto& req : f.b->bucket_requests()) {
    EXPECT_EQ(req.selector, Selector::kTarget);  // from the session, never chosen per payload
    EXPECT_EQ(req.weight_version, "1");
    EXPECT_EQ(req.group_name, "weightcast-pp_0");
  }
}

TEST(Updater, GroupRanksFollowEachEnginesRankCount) {
  Fixture f;
  ASSERT_TRUE(f.updater->update({}).ok);
  ASSERT_EQ(f.a->inits.size(), 1u);
  ASSERT_EQ(f.b->inits.size(), 1u);
  EXPECT_EQ(f.a->inits[0].rank_offset, 1);
  EXPECT_EQ(f.b->inits[0].rank_offset, 2);
  EXPECT_EQ(f.a->inits[0].world_size, 4);  // source + 1 + 2
  EXPECT_EQ(f.b->inits[0].world_size, 4);
  EXPECT_EQ(f.a->inits[0].master_port, f.b->inits[0].master_port);
  EXPECT_GT(f.a->inits[0].master_port, 0);
}

TEST(Updater, StepsRunInProtocolOrderOnEachEngine) {
  Fixture f;
  const auto tensors = testing::random_tensors(2, 10, 900);
  ASSERT_TRUE(f.updater->update(views(tensors)).ok);
  for (const std::string url : {kA, kB}) {
    const auto at = [&](const std::string& what) { return f.wire.index_of(url + " " + what); };
    const int buckets = static_cast<int>(f.a->bucket_requests().size());
    ASSERT_GT(buckets, 1);
    EXPECT_LT(at("POST /pause_generation"), at("POST /flush_cache"));
    EXPECT_LT(at("POST /flush_cache"), at("POST /begin_weight_update target"));
    EXPECT_LT(at("POST /begin_weight_update target"),
              at("POST /update_weights_from_distributed 0"));
    EXPECT_LT(f.wire.index_of("broadcast " + std::to_string(buckets - 1)),
              at("POST /update_weight_version 1"));
    EXPECT_LT(at("POST /update_weight_version 1"), at("POST /end_weight_update"));
    EXPECT_LT(at("POST /end_weight_update"), at("POST /continue_generation"));
    EXPECT_EQ(at("POST /abort_weight_update"), -1);
  }
}

// A begin refused with 409 means another client holds a session there: the updater aborts its
// own session elsewhere (by id) and leaves the busy engine entirely alone (no abort, no resume).
// B refuses begin_weight_update with `status`: the update fails naming B and the route, our
// session on A is aborted and never ended, B (where we opened nothing) is not aborted, and A keeps
// its version. Returns the report for the checks that depend on the status.
UpdateReport begin_refused_by_b(Fixture& f, int status) {
  f.b->fail_route("POST /begin_weight_update", status);
  const auto report = f.updater->update(views(testing::random_tensors(3, 5, 100)));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kB);
  EXPECT_EQ(report.failed_route, "POST /begin_weight_update");
  EXPECT_NE(report.error.find(kB), std::string::npos) << report.error;
  EXPECT_NE(f.wire.index_of(std::string(kA) + " POST /abort_weight_update"), -1);
  EXPECT_EQ(f.wire.index_of(std::string(kB) + " POST /abort_weight_update"), -1);
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " POST /end_weight_update"), -1);
  EXPECT_EQ(f.a->version(), "0");
  return report;
}

TEST(Updater, BusyEngineIsLeftAloneAndOurOtherSessionsAreAbortedById) {
  Fixture f;
  const auto report = begin_refused_by_b(f, 409);
  EXPECT_NE(report.error.find("engine busy"), std::string::npos) << report.error;
  EXPECT_NE(f.wire.index_of(std::string(kA) + " POST /continue_generation"), -1);
  EXPECT_EQ(f.wire.index_of(std::string(kB) + " POST /continue_generation"), -1);
}

TEST(Updater, BeginFailureAbortsOurSessionsAndResumesEveryEngine) {
  Fixture f;
  begin_refused_by_b(f, 500);
  // B opened nothing of ours: nothing to abort there, but it is resumed.
  EXPECT_NE(f.wire.index_of(std::string(kB) + " POST /continue_generation"), -1);
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " POST /update_weights_from_distributed 0"), -1);
}

TEST(Updater, UnreachableEngineMidDataIsBlamedAndNobodyCommits) {
  Fixture f;
  f.b->fail_route("POST /update_weights_from_distributed", 0, /*after=*/2);
  const auto tensors = testing::random_tensors(4, 40, 900);
  const auto report = f.updater->update(views(tensors));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kB) << report.error;
  EXPECT_EQ(report.failed_route, "POST /update_weights_from_distributed");
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " POST /end_weight_update"), -1);
  EXPECT_NE(f.wire.index_of(std::string(kA) + " POST /abort_weight_update"), -1);
  EXPECT_TRUE(f.a->committed().empty());
  EXPECT_EQ(f.a->version(), "0");

  // The group broke with the update: the next one sets up a new group and succeeds, and the
  // failed attempt did not use up a version.
  f.b->clear_failures();
  const auto retry = f.updater->update(views(tensors));
  ASSERT_TRUE(retry.ok) << retry.error;
  EXPECT_EQ(retry.version, "1");
  EXPECT_EQ(f.a->inits.size(), 2u);
  EXPECT_EQ(f.b->committed(), testing::as_map(tensors));
}

TEST(Updater, CommitFailureTakesTheAbortPath) {
  Fixture f;
  f.a->fail_route("POST /update_weight_version", 500);
  const auto report = f.updater->update(views(testing::random_tensors(5, 4, 64)));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kA);
  EXPECT_EQ(f.wire.index_of(std::string(kB) + " POST /end_weight_update"), -1);
  EXPECT_NE(f.wire.index_of(std::string(kB) + " POST /abort_weight_update"), -1);
  EXPECT_EQ(f.b->version(), "0");
}

TEST(Updater, RefusesAnEngineWithoutTheSelector) {
  Fixture f;
  f.b->set_selectors({Selector::kAll});
  try {
    f.updater->update({});
    FAIL() << "expected ConfigError";
  } catch (const comm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(kB), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'target'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " POST /pause_generation"), -1);
}

TEST(Updater, EngineThatRecordsAnotherSelectorFailsTheUpdate) {
  Fixture f;
  f.a->set_begin_answer(Selector::kAll);
  const auto report = f.updater->update({});
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kA);
  EXPECT_NE(report.error.find("recorded selector 'all'"), std::string::npos) << report.error;
}

TEST(Updater, AutoSelectorComesFromTheDecisionFunction) {
  UpdaterOptions frozen_draft;
  frozen_draft.selector_config = {"EAGLE", 0, "raw"};
  Fixture f(frozen_draft);
  EXPECT_EQ(f.updater->selector(), Selector::kTarget);
  ASSERT_TRUE(f.updater->update(views(testing::random_tensors(6, 3, 64))).ok);
  EXPECT_NE(f.wire.index_of(std::string(kA) + " POST /begin_weight_update target"), -1);

  UpdaterOptions bridge;
  bridge.selector_config = {"EAGLE", 0, "bridge"};
  Fixture g(bridge);
  EXPECT_EQ(g.updater->selector(), Selector::kAll);
  UpdaterOptions trained_mtp;
  trained_mtp.selector_config = {"EAGLE", 1, "raw"};
  EXPECT_EQ(Fixture(trained_mtp).updater->selector(), Selector::kAll);
}

TEST(Updater, VersionContinuesFromTheEngines) {
  Fixture f;
  f.a->set_version("7");
  f.b->set_version("5");
  auto report = f.updater->update({});
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "8");
  report = f.updater->update({});
  ASSERT_TRUE(report.ok) << report.error;
  EXPECT_EQ(report.version, "9");
  EXPECT_EQ(f.b->version(), "9");
}

TEST(Updater, ReportHasPhaseTimings) {
  Fixture f;
  const auto report = f.updater->update(views(testing::random_tensors(7, 20, 900)));
  ASSERT_TRUE(report.ok);
  EXPECT_GT(report.phases.data, 0.0);
  EXPECT_GT(report.seconds, 0.0);
  EXPECT_GE(report.seconds, report.phases.data);
  EXPECT_NE(summary(report).find("version 1 selector target"), std::string::npos);
}

TEST(Updater, RefusedInitFailsGroupSetupPromptlyNamingTheEngine) {
  // The real Gloo rendezvous: engine b refuses its init, so its ranks never join. Stopping the
  // store must end the source's wait long before the group timeout.
  testing::FakeWire wire;
  std::vector<std::unique_ptr<EngineApi>> engines;
  engines.push_back(std::make_unique<FakeEngine>(kA, wire, 1));
  auto b = std::make_unique<FakeEngine>(kB, wire, 1);
  b->fail_route("POST /init_weights_update_group", 400);
  engines.push_back(std::move(b));
  UpdaterOptions options;
  options.selector = Selector::kTarget;
  options.group_timeout = comm::Millis(60000);
  DistributedUpdater updater(std::move(engines), options);
  const auto start = std::chrono::steady_clock::now();
  const auto report = updater.update({});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, kB);
  EXPECT_EQ(report.failed_route, "POST /init_weights_update_group");
  EXPECT_EQ(wire.index_of(std::string(kA) + " POST /pause_generation"), -1);
}

TEST(Updater, SessionTokenRoundTrips) {
  const UpdateSession joined = join_session("draft 12");
  EXPECT_EQ(joined.selector(), Selector::kDraft);
  EXPECT_EQ(joined.version(), "12");
  EXPECT_EQ(joined.token(), "draft 12");
  EXPECT_FALSE(joined.session_id(0));
  const UpdateSession owned = join_session("target 3 abc123,-,def456");
  EXPECT_EQ(owned.session_id(0), std::optional<std::string>("abc123"));
  EXPECT_FALSE(owned.session_id(1));
  EXPECT_EQ(owned.session_id(2), std::optional<std::string>("def456"));
  EXPECT_EQ(owned.token(), "target 3 abc123,-,def456");
  EXPECT_THROW(join_session("everything 12"), comm::BadRequestError);
  EXPECT_THROW(join_session("target"), comm::BadRequestError);
  EXPECT_THROW(join_session("target 3 "), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync::trainer

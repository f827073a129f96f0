// Whole updates through the in-process server and the fake data plane: commit semantics
// (safe and legacy finalize), out-of-order bucket requests, failures, the watchdog, and what
// /server_info, /weights_checksum and /metrics report.
#include <future>
#include <thread>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

using namespace std::chrono_literals;

class UpdateTest : public EngineHttpFixture {
 protected:
  // Opens a session for `selector` and sends it one bucket: the first target tensor of step 1.
  void begin_with_one_bucket(Selector selector) {
    ASSERT_EQ(post("/begin_weight_update",
                   R"({"selector":")" + std::string(to_string(selector)) + R"("})")
                  .first,
              200);
    ASSERT_EQ(
        post("/update_weights_from_distributed", bucket_body(0, {target_weights(1)[0]}, selector))
            .first,
        200);
  }

  // One whole update of the target tensors at `step` in two buckets whose requests are sent in
  // reverse order from two threads. Returns the end status.
  int update(Selector selector, std::uint64_t step, const std::string& version) {
    const auto w = target_weights(step);
    const std::vector<RawTensor> b0 = {w[0]}, b1 = {w[1], w[2]};
    const std::string sel = std::string(to_string(selector));
    EXPECT_EQ(post("/begin_weight_update", R"({"selector":")" + sel + R"("})").first, 200);
    // Queue the data in broadcast order, then send the requests out of order.
    const std::string body0 = bucket_body(0, b0, selector);
    const std::string body1 = bucket_body(1, b1, selector);
    auto later = std::async(std::launch::async, [&] {
      auto c = make_client();
      auto res = c->Post("/update_weights_from_distributed", body1, "application/json");
      return res ? res->status : 0;
    });
    std::this_thread::sleep_for(20ms);  // let bucket 1's request arrive first (not required)
    EXPECT_EQ(post("/update_weights_from_distributed", body0).first, 200);
    EXPECT_EQ(later.get(), 200);
    EXPECT_EQ(post("/update_weight_version", R"({"new_version":")" + version + R"("})").first, 200);
    return post("/end_weight_update", "").first;
  }
};

TEST_F(UpdateTest, SafeFinalizeAllSelectorLeavesTheFrozenDraftBitIdentical) {
  start({}, "", /*ranks=*/2);
  join("g");
  const Snapshot before = snapshot();
  // Checked after every update: the shuffle is a permutation of finite order (3 for some
  // shapes), so a draft re-shuffled on every update can match again after a few of them.
  for (std::uint64_t step = 1; step <= 3; ++step) {
    ASSERT_EQ(update(Selector::kAll, step, "v" + std::to_string(step)), 200);
    EXPECT_EQ(snapshot().draft_digest, before.draft_digest) << "after update " << step;
  }
  const Snapshot after = snapshot();
  EXPECT_EQ(after.target_digest, to_string(expected_combined(target_weights(3), Layout::kShuffle)));
  EXPECT_EQ(after.weight_version, "v3");
  auto [st, sum] = get("/weights_checksum?runner=target");
  ASSERT_EQ(st, 200);
  EXPECT_TRUE(sum["ranks_agree"].get<bool>());
  ASSERT_EQ(sum["rank_staged_digests"].size(), 2u);
  EXPECT_EQ(sum["rank_staged_digests"][0],
            to_string(expected_combined(target_weights(3), Layout::kNone)));
  EXPECT_EQ(sum["rank_staged_digests"][1], sum["rank_staged_digests"][0]);
  EXPECT_EQ(sum["tensors"].size(), 3u);
}

TEST_F(UpdateTest, LegacyFinalizeReproducesTheBugOnlyForSelectorAll) {
  EngineOptions legacy;
  legacy.legacy_finalize = true;
  start(legacy);
  join("g");
  const Snapshot before = snapshot();
  ASSERT_EQ(update(Selector::kTarget, 1, "v1"), 200);
  EXPECT_EQ(snapshot().draft_digest, before.draft_digest) << "selector target: draft untouched";
  ASSERT_EQ(update(Selector::kAll, 2, "v2"), 200);
  EXPECT_NE(snapshot().draft_digest, before.draft_digest) << "selector all: draft re-shuffled";
  EXPECT_EQ(snapshot().target_digest,
            to_string(expected_combined(target_weights(2), Layout::kShuffle)))
      << "every target tensor was loaded, so it is shuffled once";
}

TEST_F(UpdateTest, ReceiveFailureAnswersErrorAndKeepsPreviousWeights) {
  EngineOptions opts;
  opts.comm_timeout = comm::Millis(1500);  // ample for the good buckets on a loaded machine
  start(opts);
  join("g");
  ASSERT_EQ(update(Selector::kTarget, 1, "v1"), 200);
  const Snapshot before = snapshot();
  ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
  ASSERT_EQ(post("/update_weight_version", R"({"new_version":"v2"})").first, 200);
  const auto w = target_weights(2);
  ASSERT_EQ(
      post("/update_weights_from_distributed", bucket_body(0, {w[0]}, Selector::kTarget)).first,
      200);
  // The sender stops: bucket 1's bytes never come.
  auto [st, body] = post("/update_weights_from_distributed",
                         bucket_body(1, {w[1]}, Selector::kTarget, "g", /*queue_bytes=*/false));
  EXPECT_EQ(st, 504) << body.dump();
  EXPECT_NE(body.value("message", "").find("bucket 1"), std::string::npos) << body.dump();
  Snapshot after = snapshot();
  ASSERT_EQ(after.groups, std::vector<std::string>{"g(x)"}) << "the group is left aborted";
  after.groups = before.groups;
  EXPECT_EQ(after, before) << "previous weights and weight_version stay";
  // (An id-less end is SGLang's dialect: 400.)
  EXPECT_EQ(post("/end_weight_update", "").first, 400) << "the failed session is gone";
  // Recovery: a new init replaces the aborted group, and a full update goes through.
  join("g");
  ASSERT_EQ(update(Selector::kTarget, 3, "v3"), 200);
  EXPECT_EQ(snapshot().target_digest,
            to_string(expected_combined(target_weights(3), Layout::kShuffle)));
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("weightcast_engine_updates_total{outcome=\"ok\"} 2"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("weightcast_engine_updates_total{outcome=\"failed\"} 1"),
            std::string::npos);
}

TEST_F(UpdateTest, WatchdogAbortsAnIdleSession) {
  EngineOptions opts;
  opts.session_timeout = comm::Millis(1000);  // the bucket below must come before it passes
  start(opts);
  join("g");
  const Snapshot before = snapshot();
  ASSERT_NO_FATAL_FAILURE(begin_with_one_bucket(Selector::kAll));
  const auto deadline = comm::deadline_after(comm::Millis(10000));
  while (engine_->in_session() && !comm::expired(deadline)) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(engine_->in_session());
  Snapshot after = snapshot();
  EXPECT_EQ(after.groups, std::vector<std::string>{"g(x)"}) << "its group is aborted";
  after.groups = before.groups;
  EXPECT_EQ(after, before);
  EXPECT_EQ(post("/end_weight_update", "").first, 400);  // id-less: SGLang's dialect
}

TEST_F(UpdateTest, DestroyingAGroupInUseAbortsTheSession) {
  start();
  join("g");
  const Snapshot before = snapshot();
  ASSERT_NO_FATAL_FAILURE(begin_with_one_bucket(Selector::kTarget));
  auto [st, body] = post("/destroy_weights_update_group", R"({"group_name":"g"})");
  EXPECT_EQ(st, 200);
  EXPECT_NE(body.value("message", "").find("aborted"), std::string::npos);
  Snapshot after = snapshot();
  EXPECT_TRUE(after.groups.empty());
  after.groups = before.groups;
  EXPECT_EQ(after, before);
}

TEST_F(UpdateTest, AbortWhileABucketWaitsAnswersItWith409) {
  start();
  join("g");
  const Snapshot before = snapshot();
  ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
  const std::string body =
      bucket_body(0, {target_weights(1)[0]}, Selector::kTarget, "g", /*queue_bytes=*/false);
  auto waiting = std::async(std::launch::async, [&] {
    auto c = make_client();
    auto res = c->Post("/update_weights_from_distributed", body, "application/json");
    return res ? res->status : 0;
  });
  std::this_thread::sleep_for(50ms);  // usually in flight by now; 409 either way
  ASSERT_EQ(post("/abort_weight_update", "").first, 200);
  EXPECT_EQ(waiting.get(), 409);
  Snapshot after = snapshot();
  after.groups = before.groups;  // aborted or not, depending on whether it was in flight
  EXPECT_EQ(after, before);
}

TEST_F(UpdateTest, WeightsChecksumRecomputeQueryHashesTheResidentBytes) {
  start();
  const auto [st, stored] = get("/weights_checksum?runner=target");
  ASSERT_EQ(st, 200);
  EXPECT_FALSE(stored.value("recomputed", true));
  ASSERT_TRUE(
      engine_->runners().with_tensor(Runner::kTarget, "model.b", [](const ResidentTensor& t) {
        t.bytes.data()[3] ^= std::byte{1};  // behind it
      }));
  EXPECT_EQ(get("/weights_checksum?runner=target&recompute=0").second["digest"], stored["digest"]);
  for (const char* yes : {"1", "true"}) {
    const auto [status, now] = get(std::string("/weights_checksum?runner=target&recompute=") + yes);
    ASSERT_EQ(status, 200);
    EXPECT_TRUE(now.value("recomputed", false));
    EXPECT_NE(now["digest"], stored["digest"]) << "recompute=" << yes << " gave the stored digest";
  }
  const auto [bad, why] = get("/weights_checksum?runner=target&recompute=yes");
  EXPECT_EQ(bad, 400);
  EXPECT_NE(why.value("message", "").find("recompute"), std::string::npos) << why;
}

TEST_F(UpdateTest, ServerInfoAndMetricsReportTheEngine) {
  start({}, "", /*ranks=*/2);
  join("g");
  auto [st, info] = get("/server_info");
  ASSERT_EQ(st, 200);
  EXPECT_EQ(info["rank_count"], 2);
  EXPECT_EQ(info["tp_size"], 2);
  EXPECT_EQ(info["selectors_supported"], Json::array({"all", "target", "draft"}));
  EXPECT_FALSE(info["backends"].empty());
  EXPECT_FALSE(info["version"].get<std::string>().empty());
  ASSERT_EQ(info["runners"].size(), 2u);
  EXPECT_EQ(info["runners"][0]["name"], "target");
  EXPECT_EQ(info["runners"][0]["filter"], "model.*");
  EXPECT_EQ(info["runners"][0]["layout"], "shuffle");
  EXPECT_EQ(info["runners"][0]["tensors"], 3);
  EXPECT_EQ(info["runners"][1]["name"], "draft");
  EXPECT_EQ(info["legacy_finalize"], false);
  ASSERT_EQ(info["groups"].size(), 1u);
  EXPECT_EQ(info["groups"][0]["ranks"], 2);
  EXPECT_EQ(source_->last_spec().world_size, 3);
  // The typed reader a trainer uses accepts the document.
  auto raw = client_->Get("/server_info");
  ASSERT_TRUE(raw);
  auto typed = parse_server_info_response(raw->body);
  EXPECT_EQ(typed.rank_count, 2);
  auto sum = client_->Get("/weights_checksum?runner=target");
  ASSERT_TRUE(sum);
  EXPECT_EQ(parse_weights_checksum_response(sum->body).tensors.size(), 3u);

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  for (const char* needle : {"weightcast_engine_updates_total{outcome=\"ok\"} 0",
                             "weightcast_engine_bytes_received_total 0",
                             "weightcast_engine_last_update_duration_seconds",
                             "weightcast_engine_weight_version_info{weight_version=\"v0\"} 1",
                             "weightcast_engine_runner_digest_age_seconds{runner=\"target\"}",
                             "weightcast_engine_runner_digest_age_seconds{runner=\"draft\"}"}) {
    EXPECT_NE(metrics->body.find(needle), std::string::npos) << needle << "\n" << metrics->body;
  }
}

}  // namespace
}  // namespace weightcast::sync::engine::testing

// The engine driven the way slime and plain SGLang clients drive SGLang: update requests with
// no session, SGLang's answer shapes and statuses, /weights_checker, /model_info's types; and
// the lease a named trainer holds across its sessions (docs/protocol.md, "Sessionless updates",
// "Two dialects", "Leases").
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

// A bucket request as slime writes it: SGLang's fields only, no selector, one broadcast per
// tensor (queued on the fake data plane).
std::string slime_bucket(FakeSource& source, const std::vector<RawTensor>& tensors,
                         const std::string& version, const char* selector = nullptr) {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
  for (const auto& t : tensors) {
    source.broadcast(t.bytes);
    names.push_back(t.meta.name);
    dtypes.push_back(to_string(t.meta.dtype));
    shapes.push_back(t.meta.shape);
  }
  Json j = {{"names", names},
            {"dtypes", dtypes},
            {"shapes", shapes},
            {"group_name", "g"},
            {"weight_version", version}};
  if (selector) j["selector"] = selector;
  return j.dump();
}

std::string message(const Json& body) {
  return body.value("message", std::string());
}

class SessionlessTest : public EngineHttpFixture {};

TEST_F(SessionlessTest, EachRequestCommitsOnItsOwnWithTheVersionItCarries) {
  start({}, "", /*ranks=*/2);
  join("g");
  const Snapshot before = snapshot();
  const auto weights = target_weights(1);
  const std::vector<RawTensor> first(weights.begin(), weights.begin() + 2);
  const std::vector<RawTensor> rest(weights.begin() + 2, weights.end());
  auto [st, body] = post("/update_weights_from_distributed", slime_bucket(*source_, first, "1"));
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_NE(message(body).find("committed to target"), std::string::npos) << body.dump();
  EXPECT_NE(message(body).find("Weight version updated to 1."), std::string::npos);
  // Committed at once: no session stays open, the version is the request's.
  Snapshot mid = snapshot();
  EXPECT_FALSE(mid.in_session);
  EXPECT_EQ(mid.weight_version, "1");
  EXPECT_NE(mid.target_digest, before.target_digest);
  ASSERT_EQ(post("/update_weights_from_distributed", slime_bucket(*source_, rest, "1")).first, 200);
  const Snapshot after = snapshot();
  EXPECT_EQ(after.target_digest, to_string(expected_combined(weights, Layout::kShuffle)));
  EXPECT_EQ(after.draft_digest, before.draft_digest);
  EXPECT_EQ(get("/get_weight_version").second["weight_version"], "1");
}

// The seed's bug through a second door: with the old finalize, a covered draft is shuffled a
// second time by any commit. A sessionless update never covers a runner started as frozen.
TEST_F(SessionlessTest, FrozenDraftIsLeftBitIdenticalEvenUnderTheOldFinalize) {
  EngineOptions opts;
  opts.legacy_finalize = true;
  opts.sessionless.frozen = {Runner::kDraft};
  start(opts);
  join("g");
  const Snapshot before = snapshot();
  auto [st, body] =
      post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "1"));
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_EQ(snapshot().draft_digest, before.draft_digest);
  EXPECT_NE(snapshot().target_digest, before.target_digest);
}

TEST_F(SessionlessTest, WithoutTheFrozenMarkTheOldFinalizeReachesTheDraft) {
  EngineOptions opts;
  opts.legacy_finalize = true;  // the control: proves the test above can fail
  start(opts);
  join("g");
  const Snapshot before = snapshot();
  ASSERT_EQ(post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "1"))
                .first,
            200);
  EXPECT_NE(snapshot().draft_digest, before.draft_digest);
}

TEST_F(SessionlessTest, ASelectorOfOnlyFrozenRunnersIsRefusedAndChangesNothing) {
  EngineOptions opts;
  opts.sessionless.frozen = {Runner::kDraft};
  start(opts);
  join("g");
  const Snapshot before = snapshot();
  const std::vector<RawTensor> draft = {tensor("mtp.fc", {8, 8}, 1)};
  auto [st, body] =
      post("/update_weights_from_distributed", slime_bucket(*source_, draft, "1", "draft"));
  EXPECT_EQ(st, 400) << body.dump();
  EXPECT_FALSE(body["success"].get<bool>());
  EXPECT_NE(message(body).find("'draft' frozen"), std::string::npos) << body.dump();
  EXPECT_EQ(snapshot(), before);
}

TEST_F(SessionlessTest, RefusedWhileAnOwnedSessionOrItsLeaseLives) {
  start();
  join("g");
  auto [bst, begun] = post("/begin_weight_update", R"({"selector":"target","holder":"h:1 a"})");
  ASSERT_EQ(bst, 200) << begun.dump();
  const std::string lease = begun["lease_id"];
  const std::string sid = begun["session_id"];
  EXPECT_EQ(lease.size(), 32u);
  auto [st, body] =
      post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "9"));
  EXPECT_EQ(st, 400) << body.dump();  // SGLang's status for any failure
  EXPECT_NE(message(body).find("'h:1 a'"), std::string::npos) << body.dump();
  ASSERT_EQ(post("/end_weight_update", R"({"session_id":")" + sid + R"("})").first, 200);
  // The session is over, the lease lives on: still refused, naming holder and time left.
  source_->clear();
  std::tie(st, body) =
      post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "9"));
  EXPECT_EQ(st, 400) << body.dump();
  EXPECT_NE(message(body).find("engine leased by 'h:1 a' for"), std::string::npos) << body.dump();
  EXPECT_EQ(snapshot().weight_version, "v0");
  ASSERT_EQ(post("/release_weight_update_lease", R"({"lease_id":")" + lease + R"("})").first, 200);
  source_->clear();
  std::tie(st, body) =
      post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "9"));
  EXPECT_EQ(st, 200) << body.dump();
  EXPECT_EQ(snapshot().weight_version, "9");
}

TEST_F(SessionlessTest, InsideAnIdlessSessionARequestTakesTheSessionsSelector) {
  start();
  join("g");
  ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
  auto [st, body] =
      post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "1"));
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_TRUE(snapshot().in_session);  // staged for the session's end, not committed alone
  EXPECT_EQ(snapshot().weight_version, "v0");
  ASSERT_EQ(post("/end_weight_update", "{}").first, 200);
  EXPECT_EQ(snapshot().weight_version, "1");
}

TEST_F(SessionlessTest, SGLangDialectAnswersEveryFailureWith400OursKeepsItsStatus) {
  start();
  // No group joined: ours (a sequence) says 409, SGLang's request gets 400.
  UpdateWeightsFromDistributedRequest native;
  native.tensors = metas_of(target_weights(1));
  native.group_name = "nope";
  native.selector = Selector::kTarget;
  native.sequence = 0;
  ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target","holder":"h:1 a"})").first, 200);
  EXPECT_EQ(post("/update_weights_from_distributed", to_json_string(native)).first, 409);
  // An id-less end of an owned session: 400 in SGLang's dialect.
  auto [st, body] = post("/end_weight_update", "{}");
  EXPECT_EQ(st, 400) << body.dump();
  EXPECT_FALSE(body["success"].get<bool>());
  // begin inside a session: 400 for an id-less client, 409 for a named one (state rule).
  EXPECT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 400);
  EXPECT_EQ(post("/begin_weight_update", R"({"selector":"target","holder":"h:2 b"})").first, 409);
}

TEST_F(SessionlessTest, DestroyingAnUnknownGroupIsSGLangs400) {
  start();
  auto [st, body] = post("/destroy_weights_update_group", R"({"group_name":"none"})");
  EXPECT_EQ(st, 400);
  EXPECT_EQ(body["success"], false);
  EXPECT_EQ(body["message"], "The group to be destroyed does not exist.");
}

TEST_F(SessionlessTest, UpdateWeightVersionDefaultsToAbortAllRequestsAndEchoesTheVersion) {
  start();
  auto [st, body] = post("/update_weight_version", R"({"new_version":"7"})");
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_EQ(body["new_version"], "7");
  EXPECT_NE(message(body).find("Weight version updated to 7"), std::string::npos);
  EXPECT_NE(message(body).find("abort_all_requests"), std::string::npos) << body.dump();
  std::tie(st, body) =
      post("/update_weight_version", R"({"new_version":"8","abort_all_requests":false})");
  ASSERT_EQ(st, 200);
  EXPECT_EQ(message(body).find("abort_all_requests"), std::string::npos) << body.dump();
}

TEST_F(SessionlessTest, FlushCacheTrueFlushesAfterTheCommitAndSaysSo) {
  start();
  join("g");
  Json req = Json::parse(slime_bucket(*source_, target_weights(1), "1"));  // flush_cache absent
  auto [st, body] = post("/update_weights_from_distributed", req.dump());
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_NE(message(body).find("cache flushed"), std::string::npos) << body.dump();
  req = Json::parse(slime_bucket(*source_, target_weights(2), "2"));
  req["flush_cache"] = false;
  std::tie(st, body) = post("/update_weights_from_distributed", req.dump());
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_EQ(message(body).find("cache flushed"), std::string::npos) << body.dump();
}

TEST_F(SessionlessTest, WeightsCheckerChecksumSnapshotCompare) {
  start();
  join("g");
  auto [st, sums] = post("/weights_checker", R"({"action":"checksum"})");
  ASSERT_EQ(st, 200) << sums.dump();
  EXPECT_EQ(sums["checksums"]["target"], snapshot().target_digest);
  EXPECT_EQ(sums["checksums"]["draft"], snapshot().draft_digest);
  EXPECT_EQ(post("/weights_checker", R"({"action":"compare"})").first, 400);  // no snapshot yet
  ASSERT_EQ(post("/weights_checker", R"({"action":"snapshot"})").first, 200);
  EXPECT_EQ(post("/weights_checker", R"({"action":"compare"})").first, 200);
  ASSERT_EQ(post("/update_weights_from_distributed", slime_bucket(*source_, target_weights(1), "1"))
                .first,
            200);
  auto [cst, differ] = post("/weights_checker", R"({"action":"compare"})");
  EXPECT_EQ(cst, 400);
  EXPECT_NE(message(differ).find("'target'"), std::string::npos) << differ.dump();
  EXPECT_EQ(message(differ).find("'draft'"), std::string::npos) << differ.dump();
  EXPECT_EQ(post("/weights_checker", R"({"action":"reset_tensors"})").first, 400);
  EXPECT_EQ(post("/weights_checker", R"({})").first, 400);
}

TEST_F(SessionlessTest, ModelInfoHasSGLangsFieldTypes) {
  start();
  for (const char* route : {"/model_info", "/get_model_info"}) {
    auto [st, info] = get(route);
    ASSERT_EQ(st, 200);
    EXPECT_TRUE(info["model_path"].is_string()) << info.dump();
    EXPECT_TRUE(info["tokenizer_path"].is_string()) << info.dump();
    EXPECT_TRUE(info["is_generation"].is_boolean());
    EXPECT_TRUE(info["preferred_sampling_params"].is_null());
    EXPECT_TRUE(info["weight_version"].is_string());
  }
}

class LeaseTest : public EngineHttpFixture {
 protected:
  std::pair<int, Json> begin(const std::string& holder, const std::string& lease = "",
                             int ttl = 0) {
    Json j = {{"selector", "target"}, {"holder", holder}};
    if (!lease.empty()) j["lease_id"] = lease;
    if (ttl) j["lease_ttl_s"] = ttl;
    return post("/begin_weight_update", j.dump());
  }
  void end(const Json& begun) {
    ASSERT_EQ(post("/end_weight_update", Json{{"session_id", begun["session_id"]}}.dump()).first,
              200);
  }
};

TEST_F(LeaseTest, AnotherHolderIsRefusedAcrossSessionsUntilTheLeaseIsReleased) {
  start();
  auto [st, a] = begin("h:1 a");
  ASSERT_EQ(st, 200) << a.dump();
  const std::string lease = a["lease_id"];
  EXPECT_EQ(a["lease_ttl_s"], 300);
  end(a);
  // Between a's sessions: b is refused, naming a and the seconds left.
  auto [bst, b] = begin("h:2 b");
  EXPECT_EQ(bst, 409);
  EXPECT_NE(message(b).find("engine leased by 'h:1 a' for 300 more s"), std::string::npos)
      << b.dump();
  // a without its lease id is refused too; with it, its next session opens and renews.
  EXPECT_EQ(begin("h:1 a").first, 409);
  auto [ast, a2] = begin("h:1 a", lease);
  ASSERT_EQ(ast, 200) << a2.dump();
  EXPECT_EQ(a2["lease_id"], lease);
  end(a2);
  EXPECT_EQ(post("/release_weight_update_lease", R"({"lease_id":"0123"})").first, 409);
  ASSERT_EQ(post("/release_weight_update_lease", Json{{"lease_id", lease}}.dump()).first, 200);
  auto [b2st, b2] = begin("h:2 b");
  EXPECT_EQ(b2st, 200) << b2.dump();
  EXPECT_NE(b2["lease_id"], lease);
}

TEST_F(LeaseTest, AnOperatorBreaksItWithForceWhichAlsoAbortsTheOpenSession) {
  start();
  auto [st, a] = begin("h:1 a");
  ASSERT_EQ(st, 200);
  auto [fst, forced] = post("/release_weight_update_lease", R"({"force":true})");
  ASSERT_EQ(fst, 200) << forced.dump();
  EXPECT_NE(message(forced).find("aborted"), std::string::npos) << forced.dump();
  EXPECT_FALSE(snapshot().in_session);
  EXPECT_EQ(begin("h:2 b").first, 200);
}

TEST_F(LeaseTest, ItExpiresWhenItsHolderVanishes) {
  start();
  auto [st, a] = begin("h:1 a", "", /*ttl=*/1);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(a["lease_ttl_s"], 1);
  end(a);
  EXPECT_EQ(begin("h:2 b").first, 409);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(begin("h:2 b").first, 200);
}

TEST_F(LeaseTest, IdsAreFreshRandomHex) {
  start();
  auto [st, a] = begin("h:1 a");
  ASSERT_EQ(st, 200);
  const std::string sid = a["session_id"];
  EXPECT_EQ(sid.size(), 32u);
  EXPECT_EQ(sid.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(sid, a["lease_id"].get<std::string>());
  end(a);
  auto [st2, a2] = begin("h:1 a", a["lease_id"]);
  ASSERT_EQ(st2, 200);
  EXPECT_NE(a2["session_id"], sid);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing

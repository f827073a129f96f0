// Session owners over HTTP (docs/protocol.md, "Session owners"): a session opened with a holder
// answers with its session_id; calls with another id or none are refused (409, naming the holder)
// and change nothing; the owner's calls go through; force (with the engine's token) aborts any
// session; an unowned (SGLang-style) session keeps serving id-less calls.
#include <gtest/gtest.h>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

class OwnerTest : public EngineHttpFixture {
 protected:
  // Opens an owned session and returns its id.
  std::string begin_owned(const std::string& holder) {
    auto [st, body] =
        post("/begin_weight_update", Json{{"selector", "all"}, {"holder", holder}}.dump());
    EXPECT_EQ(st, 200) << body.dump();
    EXPECT_EQ(body.value("holder", ""), holder);
    EXPECT_EQ(body.value("weight_version", ""), "v0");
    const std::string id = body.value("session_id", "");
    EXPECT_EQ(id.size(), 32u) << body.dump();
    return id;
  }
  std::string bucket(const std::optional<std::string>& id) {
    Json j = Json::parse(bucket_body(0, target_weights(1), Selector::kAll, "g", false));
    if (id) j["session_id"] = *id;
    return j.dump();
  }
  static std::string with_id(Json j, const std::optional<std::string>& id) {
    if (id) j["session_id"] = *id;
    return j.dump();
  }
  // Every session call a stranger could make, with `id`; each must be refused naming the holder
  // and leave the engine as it was: 409 in our dialect (an id, a bucket sequence, a holder at
  // begin), 400 in SGLang's (an id-less call).
  void expect_all_refused(const std::optional<std::string>& id, const std::string& holder) {
    const Snapshot before = snapshot();
    const std::vector<std::pair<std::string, std::string>> calls = {
        {"/update_weights_from_distributed", bucket(id)},
        {"/update_weight_version", with_id({{"new_version", "stolen"}}, id)},
        {"/end_weight_update", with_id(Json::object(), id)},
        {"/abort_weight_update", with_id(Json::object(), id)},
        {"/begin_weight_update", Json{{"selector", "target"}, {"holder", "intruder"}}.dump()},
    };
    for (const auto& [route, body] : calls) {
      auto [st, answer] = post(route, body);
      // The bucket carries a sequence and the begin a holder: ours, whatever the id.
      const bool native = id.has_value() || route == "/begin_weight_update" ||
                          route == "/update_weights_from_distributed";
      EXPECT_EQ(st, native ? 409 : 400) << route << " " << answer.dump();
      EXPECT_NE(answer.value("message", "").find(holder), std::string::npos)
          << route << ": " << answer.dump();
    }
    EXPECT_EQ(snapshot(), before);
  }
};

TEST_F(OwnerTest, StrangersCannotUpdateEndOrAbortAnOwnedSession) {
  start();
  join("g");
  const std::string id = begin_owned("trainer-a:101 grp");
  expect_all_refused(std::nullopt, "trainer-a:101 grp");
  expect_all_refused(std::string(32, '0'), "trainer-a:101 grp");
  // The owner still completes its update with its id.
  source_->broadcast(pack_bucket(0, target_weights(1)).bytes);
  auto [st, body] = post("/update_weights_from_distributed", bucket(id));
  ASSERT_EQ(st, 200) << body.dump();
  ASSERT_EQ(post("/update_weight_version", with_id({{"new_version", "v1"}}, id)).first, 200);
  auto [end_st, end] = post("/end_weight_update", with_id(Json::object(), id));
  ASSERT_EQ(end_st, 200) << end.dump();
  EXPECT_EQ(end.value("weight_version", ""), "v1");
}

TEST_F(OwnerTest, ForceWithTheTokenAbortsAnySession) {
  start({}, "secret");
  const std::string id = begin_owned("trainer-a:101 grp");
  auto [st, body] = post("/abort_weight_update", R"({"force": true})");
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_FALSE(snapshot().in_session);
  // The holder's lease outlives the aborted session; breaking it takes force (and the token) too.
  EXPECT_EQ(http(/*token=*/"").post("/release_weight_update_lease", R"({"force": true})").status,
            401);
  ASSERT_EQ(post("/release_weight_update_lease", R"({"force": true})").first, 200);
  // Without the token, force is refused by the route's auth before the engine sees it.
  begin_owned("trainer-b:7 grp");
  EXPECT_EQ(http(/*token=*/"").post("/abort_weight_update", R"({"force": true})").status, 401);
  EXPECT_TRUE(snapshot().in_session);
  (void)id;
}

TEST_F(OwnerTest, UnownedSessionsServeIdLessClientsButCheckAnIdGiven) {
  start();
  join("g");
  auto [st, body] = post("/begin_weight_update", R"({"selector":"all"})");
  ASSERT_EQ(st, 200) << body.dump();
  const std::string id = body.value("session_id", "");
  EXPECT_FALSE(id.empty());
  EXPECT_FALSE(body.contains("holder"));
  EXPECT_EQ(post("/update_weight_version", R"({"new_version":"v1"})").first, 200);
  auto [wrong_st, wrong] = post("/end_weight_update", with_id(Json::object(), "nope"));
  EXPECT_EQ(wrong_st, 409) << wrong.dump();
  EXPECT_NE(wrong.value("message", "").find("an unnamed client"), std::string::npos);
  EXPECT_EQ(post("/end_weight_update", "{}").first, 200);
}

TEST_F(OwnerTest, AStaleIdAfterTheSessionEndedIsRefusedNotApplied) {
  start();
  const std::string id = begin_owned("trainer-a:101 grp");
  ASSERT_EQ(post("/abort_weight_update", with_id(Json::object(), id)).first, 200);
  auto [st, body] = post("/update_weight_version", with_id({{"new_version", "late"}}, id));
  EXPECT_EQ(st, 409) << body.dump();
  EXPECT_EQ(snapshot().weight_version, "v0");
  // Abort stays idempotent for its owner.
  EXPECT_EQ(post("/abort_weight_update", with_id(Json::object(), id)).first, 200);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing

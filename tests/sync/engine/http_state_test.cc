// The session state machine over HTTP: every (state, route) pair, with the expected status and
// the expected state afterwards; a refusal must leave the state unchanged. The begin and end rows
// are id-less (SGLang's dialect), so their refusals are 400s (docs/protocol.md, "Two dialects").
#include <functional>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

enum class State { kIdle, kIdlePaused, kSession, kSessionPaused };
const State kStates[] = {State::kIdle, State::kIdlePaused, State::kSession, State::kSessionPaused};

bool in_session(State s) {
  return s == State::kSession || s == State::kSessionPaused;
}
const char* name(State s) {
  // In the order of State's members.
  constexpr const char* kNames[] = {"idle", "idle+paused", "session(target)",
                                    "session(target)+paused"};
  return kNames[static_cast<int>(s)];
}

class StateTableTest : public EngineHttpFixture {
 protected:
  // A fresh engine with group "g" joined, put into `state`.
  void enter(State state) {
    start();
    join("g");
    if (state == State::kIdlePaused || state == State::kSessionPaused) {
      ASSERT_EQ(post("/pause_generation", R"({"mode":"in_place"})").first, 200);
    }
    if (in_session(state)) {
      ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
    }
  }
};

struct Row {
  const char* what;
  bool is_get;
  std::string path;
  // Body for the request (may queue data-plane bytes through the fixture).
  std::function<std::string(EngineHttpFixture&)> body;
  // Expected status in `state`.
  std::function<int(State)> status;
  // Expected snapshot after a 2xx, from the one before (refusals must leave it unchanged).
  std::function<void(State, Snapshot&)> effect;
};

std::vector<Row> rows() {
  const auto always = [](int code) { return [code](State) { return code; }; };
  const auto none = [](State, Snapshot&) {};
  const auto in_or = [](int in, int idle) {
    return [in, idle](State s) { return in_session(s) ? in : idle; };
  };
  const auto end_session = [](State, Snapshot& s) {
    s.in_session = false;
    s.session_selector = nullptr;
  };
  return {
      {"init g2", false, "/init_weights_update_group",
       [](EngineHttpFixture& f) { return f.init_body("g2"); }, always(200),
       [](State, Snapshot& s) { s.groups.push_back("g2"); }},
      {"destroy g", false, "/destroy_weights_update_group",
       [](EngineHttpFixture&) { return std::string(R"({"group_name":"g"})"); }, always(200),
       [](State, Snapshot& s) { s.groups.clear(); }},
      {"destroy unknown", false, "/destroy_weights_update_group",
       [](EngineHttpFixture&) { return std::string(R"({"group_name":"nope"})"); }, always(400),
       none},
      {"pause", false, "/pause_generation",
       [](EngineHttpFixture&) { return std::string(R"({"mode":"retract"})"); }, always(200),
       [](State, Snapshot& s) { s.paused = true; }},
      {"continue", false, "/continue_generation", [](EngineHttpFixture&) { return std::string(); },
       always(200), [](State, Snapshot& s) { s.paused = false; }},
      {"flush (GET)", true, "/flush_cache", nullptr, always(200), none},
      {"flush (POST)", false, "/flush_cache", [](EngineHttpFixture&) { return std::string(); },
       always(200), none},
      {"begin", false, "/begin_weight_update",
       [](EngineHttpFixture&) { return std::string(R"({"selector":"target"})"); }, in_or(400, 200),
       [](State, Snapshot& s) {
         s.in_session = true;
         s.session_selector = "target";
       }},
      {"bucket (target)", false, "/update_weights_from_distributed",
       [](EngineHttpFixture& f) {
         return f.bucket_body(0, {tensor("model.a", {32, 64}, 1)}, Selector::kTarget);
       },
       in_or(200, 409), none},
      {"bucket (selector all)", false, "/update_weights_from_distributed",
       [](EngineHttpFixture& f) {
         return f.bucket_body(0, {tensor("model.a", {32, 64}, 1)}, Selector::kAll);
       },
       always(409), none},
      {"bucket (unknown group)", false, "/update_weights_from_distributed",
       [](EngineHttpFixture& f) {
         return f.bucket_body(0, {tensor("model.a", {32, 64}, 1)}, Selector::kTarget, "nope",
                              false);
       },
       always(409), none},
      {"update_weight_version", false, "/update_weight_version",
       [](EngineHttpFixture&) { return std::string(R"({"new_version":"v9"})"); }, always(200),
       [](State st, Snapshot& s) {
         if (!in_session(st)) s.weight_version = "v9";  // in a session: staged until end
       }},
      {"end", false, "/end_weight_update", [](EngineHttpFixture&) { return std::string(); },
       in_or(200, 400), end_session},
      {"abort", false, "/abort_weight_update", [](EngineHttpFixture&) { return std::string(); },
       always(200), end_session},
      {"health", true, "/health", nullptr, always(200), none},
      {"server_info", true, "/server_info", nullptr, always(200), none},
      {"get_server_info", true, "/get_server_info", nullptr, always(200), none},
      {"weights_checksum", true, "/weights_checksum?runner=draft", nullptr, always(200), none},
      {"metrics", true, "/metrics", nullptr, always(200), none},
  };
}

TEST_F(StateTableTest, EveryStateAndRoute) {
  int pairs = 0;
  for (const Row& row : rows()) {
    for (State state : kStates) {
      SCOPED_TRACE(std::string(row.what) + " in " + name(state));
      TearDown();
      source_ = std::make_shared<FakeSource>();
      enter(state);
      Snapshot expected = snapshot();
      int status = 0;
      if (row.is_get) {
        auto res = client_->Get(row.path.c_str());
        ASSERT_TRUE(res);
        status = res->status;
        if (row.path != "/metrics") {
          EXPECT_EQ(Json::parse(res->body).value("success", false), status == 200) << res->body;
        }
      } else {
        auto [st, body] = post(row.path, row.body(*this));
        status = st;
        EXPECT_EQ(body.value("success", !(st == 200)), st == 200) << body.dump();
        if (st != 200) {
          EXPECT_FALSE(body.value("message", "").empty());
        }
      }
      EXPECT_EQ(status, row.status(state));
      if (status == 200) row.effect(state, expected);
      EXPECT_EQ(snapshot(), expected);
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, static_cast<int>(rows().size() * std::size(kStates)));
}

// A session's staged version and bucket become visible only at end, together.
TEST_F(StateTableTest, EndCommitsStagedVersionAndTensorsTogether) {
  enter(State::kSession);
  const auto sent = std::vector<RawTensor>{tensor("model.a", {32, 64}, 1)};
  ASSERT_EQ(post("/update_weights_from_distributed", bucket_body(0, sent, Selector::kTarget)).first,
            200);
  ASSERT_EQ(post("/update_weight_version", R"({"new_version":"v1"})").first, 200);
  Snapshot mid = snapshot();
  EXPECT_EQ(mid.weight_version, "v0");
  auto [st, body] = post("/end_weight_update", "");
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_EQ(body["weight_version"], "v1");
  Snapshot after = snapshot();
  EXPECT_EQ(after.weight_version, "v1");
  EXPECT_NE(after.target_digest, mid.target_digest);
  EXPECT_EQ(after.draft_digest, mid.draft_digest);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing

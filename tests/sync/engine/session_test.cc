// SessionMachine: every (state, operation) pair, and refusals that change nothing.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "sync/engine/control/session.h"

namespace weightcast::sync::engine {
namespace {

struct Snapshot {
  bool in_session;
  std::optional<Selector> selector;
  std::uint64_t id;
  bool paused;
  std::optional<std::string> version;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snap(const SessionMachine& m) {
  return {m.in_session(), m.selector(), m.session_id(), m.paused(), m.pending_version()};
}

TEST(SessionMachine, StartsIdleUnpaused) {
  SessionMachine m;
  EXPECT_FALSE(m.in_session());
  EXPECT_FALSE(m.selector());
  EXPECT_EQ(m.session_id(), 0u);
  EXPECT_FALSE(m.paused());
}

TEST(SessionMachine, BeginRecordsTheSelectorForEverySelector) {
  for (Selector s : kAllSelectors) {
    SessionMachine m;
    EXPECT_FALSE(m.begin(s));
    EXPECT_TRUE(m.in_session());
    EXPECT_EQ(m.selector(), s);
    EXPECT_EQ(m.session_id(), 1u);
  }
}

TEST(SessionMachine, IdleRefusesPayloadAndEndWith409AndStaysIdle) {
  SessionMachine m;
  const Snapshot before = snap(m);
  for (Selector s : kAllSelectors) {
    auto refusal = m.check_payload(s);
    ASSERT_TRUE(refusal);
    EXPECT_EQ(refusal->status, 409);
    EXPECT_NE(refusal->message.find("no session"), std::string::npos) << refusal->message;
  }
  auto end = m.check_end();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->status, 409);
  EXPECT_NE(end->message.find("without begin"), std::string::npos) << end->message;
  EXPECT_EQ(snap(m), before);
}

// Every pair of selectors: a session opened with the first, then a request that brings the second.
class SelectorPair : public ::testing::TestWithParam<std::tuple<Selector, Selector>> {
 protected:
  void SetUp() override { ASSERT_FALSE(m.begin(open())); }
  Selector open() const { return std::get<0>(GetParam()); }
  Selector requested() const { return std::get<1>(GetParam()); }

  SessionMachine m;
};

TEST_P(SelectorPair, InSessionBeginIsRefusedWith409) {
  m.set_version("v7");
  const Snapshot before = snap(m);
  auto refusal = m.begin(requested());
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->status, 409);
  EXPECT_EQ(snap(m), before);
}

TEST_P(SelectorPair, PayloadSelectorMustEqualTheSessionSelector) {
  const Snapshot before = snap(m);
  auto refusal = m.check_payload(requested());
  if (requested() == open()) {
    EXPECT_FALSE(refusal);
  } else {
    ASSERT_TRUE(refusal);
    EXPECT_EQ(refusal->status, 409);
    EXPECT_NE(refusal->message.find("selector"), std::string::npos);
  }
  EXPECT_EQ(snap(m), before);
}

std::string pair_name(const ::testing::TestParamInfo<std::tuple<Selector, Selector>>& param) {
  return std::string(to_string(std::get<0>(param.param))) + "_then_" +
         std::string(to_string(std::get<1>(param.param)));
}

INSTANTIATE_TEST_SUITE_P(EverySelectorPair, SelectorPair,
                         ::testing::Combine(::testing::ValuesIn(kAllSelectors),
                                            ::testing::ValuesIn(kAllSelectors)),
                         pair_name);

TEST(SessionMachine, EndAllowedInSessionAndCloseReturnsToIdle) {
  SessionMachine m;
  ASSERT_FALSE(m.begin(Selector::kTarget));
  EXPECT_FALSE(m.check_end());
  m.set_version("v1");
  m.request_flush();
  EXPECT_TRUE(m.close());
  EXPECT_FALSE(m.in_session());
  EXPECT_FALSE(m.pending_version());
  EXPECT_FALSE(m.flush_requested());
  EXPECT_FALSE(m.close()) << "closing twice reports that no session was open";
  ASSERT_FALSE(m.begin(Selector::kAll));
  EXPECT_EQ(m.session_id(), 2u);
}

TEST(SessionMachine, VersionIsStagedInSessionAndImmediateWhenIdle) {
  SessionMachine m;
  EXPECT_TRUE(m.set_version("a")) << "idle: the caller applies it now";
  EXPECT_FALSE(m.pending_version());
  ASSERT_FALSE(m.begin(Selector::kAll));
  EXPECT_FALSE(m.set_version("b"));
  EXPECT_EQ(m.pending_version(), "b");
  EXPECT_FALSE(m.set_version("c"));
  EXPECT_EQ(m.pending_version(), "c");
  m.close();
  EXPECT_FALSE(m.pending_version()) << "an aborted session's version is dropped";
}

TEST(SessionMachine, PauseIsOrthogonalToTheSession) {
  SessionMachine m;
  m.set_paused(true);
  ASSERT_FALSE(m.begin(Selector::kDraft));
  EXPECT_TRUE(m.paused());
  m.set_paused(false);
  EXPECT_TRUE(m.in_session());
  m.set_paused(true);
  m.close();
  EXPECT_TRUE(m.paused());
}

TEST(SessionMachine, NewSessionClearsTheFlushRequest) {
  SessionMachine m;
  ASSERT_FALSE(m.begin(Selector::kAll));
  m.request_flush();
  EXPECT_TRUE(m.flush_requested());
  m.close();
  ASSERT_FALSE(m.begin(Selector::kAll));
  EXPECT_FALSE(m.flush_requested());
}

TEST(SessionMachine, OwnedSessionsAdmitOnlyTheirToken) {
  SessionMachine m;
  ASSERT_FALSE(m.begin(Selector::kTarget, "host:1 g"));
  EXPECT_TRUE(m.owned());
  const std::string token = m.token();
  EXPECT_EQ(token.size(), 32u);
  EXPECT_FALSE(m.check_owner(token, "end_weight_update"));
  for (const std::optional<std::string>& other :
       {std::optional<std::string>(), std::optional<std::string>("x"),
        std::optional<std::string>(token + "0")}) {
    auto refusal = m.check_owner(other, "end_weight_update");
    ASSERT_TRUE(refusal);
    EXPECT_EQ(refusal->status, 409);
    EXPECT_NE(refusal->message.find("'host:1 g'"), std::string::npos) << refusal->message;
  }
  auto busy = m.begin(Selector::kAll, "host:2 g");
  ASSERT_TRUE(busy);
  EXPECT_NE(busy->message.find("busy"), std::string::npos) << busy->message;
  EXPECT_NE(busy->message.find("'host:1 g'"), std::string::npos) << busy->message;
  EXPECT_EQ(m.token(), token);  // the refusal changed nothing
}

TEST(SessionMachine, UnownedSessionsAdmitIdLessCallsAndEveryBeginDrawsANewToken) {
  SessionMachine m;
  ASSERT_FALSE(m.begin(Selector::kAll));
  EXPECT_FALSE(m.owned());
  EXPECT_FALSE(m.check_owner(std::nullopt, "update_weight_version"));
  EXPECT_TRUE(m.check_owner(std::string("wrong"), "update_weight_version"));
  const std::string first = m.token();
  m.close();
  EXPECT_TRUE(m.token().empty());
  EXPECT_FALSE(m.check_owner(first, "abort_weight_update"));  // no session: the route decides
  ASSERT_FALSE(m.begin(Selector::kAll));
  EXPECT_NE(m.token(), first);
}

}  // namespace
}  // namespace weightcast::sync::engine

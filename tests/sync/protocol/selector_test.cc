#include "sync/protocol/selector.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

TEST(Selector, ParseAndFormatRoundTrip) {
  const struct {
    std::string text;
    Selector selector;
  } cases[] = {{"all", Selector::kAll}, {"target", Selector::kTarget}, {"draft", Selector::kDraft}};
  for (const auto& c : cases) {
    EXPECT_EQ(parse_selector(c.text), c.selector) << c.text;
    EXPECT_EQ(to_string(c.selector), c.text);
  }
  for (Selector s : kAllSelectors) EXPECT_EQ(parse_selector(to_string(s)), s);
}

TEST(Selector, UnknownNamesValueAndListsValidOnes) {
  for (const std::string bad : {"", "ALL", "Target", "both", " all", "all ", "drafts"}) {
    try {
      parse_selector(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const comm::BadRequestError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("all, target, draft"), std::string::npos) << what;
    }
  }
}

TEST(Selector, UnknownValueIsQuotedSafely) {
  try {
    parse_selector(std::string("a\x1b[31m\n", 8));
    FAIL();
  } catch (const comm::BadRequestError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\x1b'), std::string::npos);
    EXPECT_EQ(what.find('\n'), std::string::npos);
    EXPECT_NE(what.find("\\x1b"), std::string::npos) << what;
  }
}

TEST(Runner, ParseAndFormat) {
  EXPECT_EQ(parse_runner("target"), Runner::kTarget);
  EXPECT_EQ(parse_runner("draft"), Runner::kDraft);
  EXPECT_EQ(to_string(Runner::kTarget), "target");
  EXPECT_EQ(to_string(Runner::kDraft), "draft");
  EXPECT_THROW(parse_runner("all"), comm::BadRequestError);
  EXPECT_THROW(parse_runner("TARGET"), comm::BadRequestError);
}

TEST(Selector, CoversTable) {
  const struct {
    Selector selector;
    Runner runner;
    bool covered;
  } table[] = {
      {Selector::kAll, Runner::kTarget, true},    {Selector::kAll, Runner::kDraft, true},
      {Selector::kTarget, Runner::kTarget, true}, {Selector::kTarget, Runner::kDraft, false},
      {Selector::kDraft, Runner::kTarget, false}, {Selector::kDraft, Runner::kDraft, true},
  };
  for (const auto& row : table) {
    EXPECT_EQ(covers(row.selector, row.runner), row.covered)
        << to_string(row.selector) << " / " << to_string(row.runner);
  }
}

TEST(Selector, CoveredRunners) {
  EXPECT_EQ(covered_runners(Selector::kAll), (std::vector{Runner::kTarget, Runner::kDraft}));
  EXPECT_EQ(covered_runners(Selector::kTarget), (std::vector{Runner::kTarget}));
  EXPECT_EQ(covered_runners(Selector::kDraft), (std::vector{Runner::kDraft}));
}

TEST(Selector, InvalidEnumValueIsMisuse) {
  EXPECT_THROW(to_string(static_cast<Selector>(7)), comm::EnforceError);
  EXPECT_THROW(covers(static_cast<Selector>(7), Runner::kTarget), comm::EnforceError);
  EXPECT_THROW(to_string(static_cast<Runner>(7)), comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync

#include "sync/protocol/selector.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"
#include "tests/support/names.h"

namespace weightcast::sync {
namespace {

TEST(Selector, ParseAndFormatRoundTrip) {
  testing::expect_names(
      parse_selector,
      {{"all", Selector::kAll}, {"target", Selector::kTarget}, {"draft", Selector::kDraft}});
  for (Selector s : kAllSelectors) EXPECT_EQ(parse_selector(to_string(s)), s);
}

TEST(Selector, UnknownNamesValueAndListsValidOnes) {
  testing::expect_refusals_name_the_value(parse_selector,
                                          {"", "ALL", "Target", "both", " all", "all ", "drafts"},
                                          "all, target, draft");
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
  testing::expect_names(parse_runner, {{"target", Runner::kTarget}, {"draft", Runner::kDraft}},
                        {"all", "TARGET"});
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

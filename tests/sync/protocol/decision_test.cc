#include "sync/protocol/decision.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

enum class Algo { kUnset, kEmpty, kSet };
enum class Mtp { kAbsent, kZero, kPositive };
enum class Mode { kAbsent, kRaw, kBridge };

SelectorConfig make(Algo a, Mtp m, Mode c) {
  SelectorConfig cfg;
  if (a == Algo::kEmpty) cfg.speculative_algorithm = "";
  if (a == Algo::kSet) cfg.speculative_algorithm = "EAGLE";
  if (m == Mtp::kZero) cfg.mtp_num_layers = 0;
  if (m == Mtp::kPositive) cfg.mtp_num_layers = 1;
  if (c == Mode::kRaw) cfg.conversion_mode = "raw";
  if (c == Mode::kBridge) cfg.conversion_mode = "bridge";
  return cfg;
}

// Every combination, written out: the single case that yields "target" is a speculative engine
// whose draft is frozen (no MTP layers) and whose weights are not bridge-converted.
TEST(Decision, FullTable) {
  using enum Selector;
  const struct {
    Algo algo;
    Mtp mtp;
    Mode mode;
    Selector expected;
  } table[] = {
      {Algo::kUnset, Mtp::kAbsent, Mode::kAbsent, kAll},
      {Algo::kUnset, Mtp::kAbsent, Mode::kRaw, kAll},
      {Algo::kUnset, Mtp::kAbsent, Mode::kBridge, kAll},
      {Algo::kUnset, Mtp::kZero, Mode::kAbsent, kAll},
      {Algo::kUnset, Mtp::kZero, Mode::kRaw, kAll},
      {Algo::kUnset, Mtp::kZero, Mode::kBridge, kAll},
      {Algo::kUnset, Mtp::kPositive, Mode::kAbsent, kAll},
      {Algo::kUnset, Mtp::kPositive, Mode::kRaw, kAll},
      {Algo::kUnset, Mtp::kPositive, Mode::kBridge, kAll},
      {Algo::kEmpty, Mtp::kAbsent, Mode::kAbsent, kAll},
      {Algo::kEmpty, Mtp::kAbsent, Mode::kRaw, kAll},
      {Algo::kEmpty, Mtp::kAbsent, Mode::kBridge, kAll},
      {Algo::kEmpty, Mtp::kZero, Mode::kAbsent, kAll},
      {Algo::kEmpty, Mtp::kZero, Mode::kRaw, kAll},
      {Algo::kEmpty, Mtp::kZero, Mode::kBridge, kAll},
      {Algo::kEmpty, Mtp::kPositive, Mode::kAbsent, kAll},
      {Algo::kEmpty, Mtp::kPositive, Mode::kRaw, kAll},
      {Algo::kEmpty, Mtp::kPositive, Mode::kBridge, kAll},
      {Algo::kSet, Mtp::kAbsent, Mode::kAbsent, kTarget},
      {Algo::kSet, Mtp::kAbsent, Mode::kRaw, kTarget},
      {Algo::kSet, Mtp::kAbsent, Mode::kBridge, kAll},
      {Algo::kSet, Mtp::kZero, Mode::kAbsent, kTarget},
      {Algo::kSet, Mtp::kZero, Mode::kRaw, kTarget},
      {Algo::kSet, Mtp::kZero, Mode::kBridge, kAll},
      {Algo::kSet, Mtp::kPositive, Mode::kAbsent, kAll},
      {Algo::kSet, Mtp::kPositive, Mode::kRaw, kAll},
      {Algo::kSet, Mtp::kPositive, Mode::kBridge, kAll},
  };
  static_assert(std::size(table) == 27);
  for (const auto& row : table) {
    const SelectorConfig cfg = make(row.algo, row.mtp, row.mode);
    EXPECT_EQ(weight_update_selector(cfg), row.expected)
        << "algo=" << cfg.speculative_algorithm.value_or("<unset>")
        << " mtp=" << (cfg.mtp_num_layers ? std::to_string(*cfg.mtp_num_layers) : "<absent>")
        << " mode=" << cfg.conversion_mode.value_or("<absent>");
  }
}

TEST(Decision, OnlyTheExactBridgeSpellingKeepsTheDraft) {
  SelectorConfig cfg;
  cfg.speculative_algorithm = "EAGLE3";
  for (const char* mode : {"Bridge", "bridge ", "hf", ""}) {
    cfg.conversion_mode = mode;
    EXPECT_EQ(weight_update_selector(cfg), Selector::kTarget) << mode;
  }
  cfg.mtp_num_layers = 3;
  EXPECT_EQ(weight_update_selector(cfg), Selector::kAll);
}

TEST(Decision, NegativeMtpLayersIsConfigError) {
  SelectorConfig cfg;
  cfg.speculative_algorithm = "EAGLE";
  cfg.mtp_num_layers = -1;
  EXPECT_THROW(weight_update_selector(cfg), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync

// A Miles-style torch trainer (tests/interop/miles_style_trainer.py: torch rank 0 hosting the
// c10d store, gloo, Miles' HTTP sequence, one dist.broadcast per tensor) drives two
// weightcast-engine processes (1 and 2 ranks, a target without layout and a frozen draft with the
// shuffle layout) that are told nothing about torch: they detect the rendezvous. After 3 updates
// with selector target, every target tensor on both engines has the XXH3-128 of what torch sent,
// the version is "3" and the draft is bit-identical to its start.
// SlimeInterop: the same with slime's sequence (tests/interop/slime_style_sender.py): no session,
// no selector, the version in every bucket and read back from /get_weight_version; the first
// engine's draft is marked frozen (--frozen-runner draft), and it stays bit-identical though the
// sessionless scope would otherwise cover it.
// MilesInterop.ExpertBuckets...: the same trainer against two engines holding a mixture of
// experts (moe-tiny): it sends the non-expert buckets first and the expert buckets after them, as
// Miles does after its expert-parallel all-gather, and every target tensor, each expert's
// included, ends with the XXH3-128 of what torch sent.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sync/trainer/http/engine_client.h"
#include "tests/interop/torch_python.h"
#include "tests/support/engine_launch.h"
#include "tests/support/subprocess.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::interop {
namespace {

using Json = nlohmann::json;
using std::chrono::seconds;
using weightcast::testing::Subprocess;

using sync::trainer::testing::TestEngine;

// The test engine, with a target that keeps the bytes as sent (so its digests are those of the
// sent bytes) beside the shuffled frozen draft.
TestEngine start_engine(int ranks, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--init-timeout-ms", "30000"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto argv = testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks, 5, args);
  testing::set_flag_value(argv, "--target-layout", "none");
  return sync::trainer::testing::start_engine_process(argv);
}

sync::trainer::EngineClient client(const std::string& url) {
  return sync::trainer::testing::test_client(url);
}

// The JSON lines the trainer printed, one per step.
std::vector<Json> steps_of(const std::string& output) {
  std::vector<Json> steps;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"step\"", 0) == 0) steps.push_back(Json::parse(line));
  }
  return steps;
}

// Miles' sequence from the torch trainer against two engines (ranks 1 and 2): 3 steps with
// selector target. Its exit code (none: it did not exit) and output, within `budget`.
std::pair<std::optional<int>, std::string> run_miles_trainer(const std::vector<TestEngine>& engines,
                                                             seconds budget) {
  Subprocess trainer({testing::torch_python(), testing::interop_script("miles_style_trainer.py"),
                      "--engines", engines[0].url + "," + engines[1].url, "--ranks", "1,2",
                      "--steps", "3", "--selector", "target", "--timeout", "60"},
                     testing::torch_env());
  std::string output = trainer.drain(budget);
  const std::optional<int> code = trainer.wait(seconds(10));
  return {code, std::move(output)};
}

// Every engine's target holds exactly `sent` at version "3"; its draft is `drafts[i]` still.
void expect_sent(const std::vector<TestEngine>& engines, const std::vector<std::string>& drafts,
                 const Json& sent);

TEST(MilesInterop, TorchTrainerUpdatesTwoWeightcastEnginesThroughDetection) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  std::vector<TestEngine> engines;
  engines.push_back(start_engine(1));
  engines.push_back(start_engine(2));
  std::vector<std::string> drafts;
  for (const auto& e : engines)
    drafts.push_back(client(e.url).weights_checksum(sync::Runner::kDraft).digest);

  const auto [code, output] = run_miles_trainer(engines, seconds(150));
  ASSERT_EQ(code, 0) << output;
  const auto steps = steps_of(output);
  ASSERT_EQ(steps.size(), 3u) << output;

  double bytes = 0, secs = 0;
  for (const auto& s : steps) {
    bytes += s["bytes"].get<double>();
    secs += s["seconds"].get<double>();
  }
  RecordProperty("miles_update_gbps", std::to_string(bytes / secs / 1e9));
  std::printf("miles-style torch trainer -> 2 weightcast engines: %.0f bytes/update, %.4f GB/s\n",
              bytes / 3, bytes / secs / 1e9);

  expect_sent(engines, drafts, steps.back()["digests"]);
}

TEST(SlimeInterop, SessionlessSenderUpdatesTwoEnginesAndNeverTheFrozenDraft) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  std::vector<TestEngine> engines;
  // Legacy finalize on the engine with the frozen draft: were the draft in the sessionless scope,
  // every commit would shuffle it again (the seed's bug), so its digest would move.
  engines.push_back(start_engine(1, {"--frozen-runner", "draft", "--legacy-finalize"}));
  engines.push_back(start_engine(2));
  std::vector<std::string> drafts;
  for (const auto& e : engines)
    drafts.push_back(client(e.url).weights_checksum(sync::Runner::kDraft).digest);

  Subprocess sender(
      {testing::torch_python(), testing::interop_script("slime_style_sender.py"), "--engines",
       engines[0].url + "," + engines[1].url, "--ranks", "1,2", "--steps", "3", "--timeout", "60"},
      testing::torch_env());
  const std::string output = sender.drain(seconds(150));
  ASSERT_EQ(sender.wait(seconds(10)), 0) << output;  // it checked /get_weight_version per step
  const auto steps = steps_of(output);
  ASSERT_EQ(steps.size(), 3u) << output;
  expect_sent(engines, drafts, steps.back()["digests"]);
}

void expect_sent(const std::vector<TestEngine>& engines, const std::vector<std::string>& drafts,
                 const Json& sent) {
  for (std::size_t i = 0; i < engines.size(); ++i) {
    auto c = client(engines[i].url);
    const auto target = c.weights_checksum(sync::Runner::kTarget);
    EXPECT_EQ(target.weight_version, "3") << engines[i].url;
    ASSERT_EQ(target.tensors.size(), sent.size()) << engines[i].url;
    for (const auto& t : target.tensors) {
      ASSERT_TRUE(sent.contains(t.name)) << t.name;
      EXPECT_EQ(t.digest, sent[t.name].get<std::string>()) << engines[i].url << " " << t.name;
    }
    EXPECT_EQ(c.weights_checksum(sync::Runner::kDraft).digest, drafts[i])
        << engines[i].url << ": the frozen draft changed";
  }
}

TestEngine start_moe_engine(int ranks) {
  auto argv =
      testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks, 5, {"--init-timeout-ms", "30000"});
  testing::set_flag_value(argv, "--model", "moe-tiny");
  testing::set_flag_value(argv, "--target-layout", "none");
  return sync::trainer::testing::start_engine_process(argv);
}

TEST(MilesInterop, ExpertBucketsAfterDenseOnesReachMoeEngines) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  std::vector<TestEngine> engines;
  engines.push_back(start_moe_engine(1));
  engines.push_back(start_moe_engine(2));
  const auto [code, output] = run_miles_trainer(engines, seconds(180));
  ASSERT_EQ(code, 0) << output;
  const auto steps = steps_of(output);
  ASSERT_EQ(steps.size(), 3u) << output;
  // The expert path ran: separate expert buckets, after the dense ones.
  EXPECT_GT(steps.back()["dense_buckets"].get<int>(), 0) << output;
  EXPECT_GT(steps.back()["expert_buckets"].get<int>(), 0) << output;

  const Json& sent = steps.back()["digests"];
  int experts = 0;
  for (const auto& e : engines) {
    const auto target =
        sync::trainer::testing::test_client(e.url).weights_checksum(sync::Runner::kTarget);
    EXPECT_EQ(target.weight_version, "3") << e.url;
    ASSERT_EQ(target.tensors.size(), sent.size()) << e.url;
    for (const auto& t : target.tensors) {
      ASSERT_TRUE(sent.contains(t.name)) << t.name;
      EXPECT_EQ(t.digest, sent[t.name].get<std::string>()) << e.url << " " << t.name;
      experts += t.name.find(".mlp.experts.") != std::string::npos;
    }
  }
  EXPECT_EQ(experts, 2 * 2 * 8 * 3);  // 2 engines x 2 layers x 8 experts x 3 matrices
}

}  // namespace
}  // namespace weightcast::interop

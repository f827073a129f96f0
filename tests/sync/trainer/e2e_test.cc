// End to end, real processes on loopback with Gloo: two weightcast-engine processes (rank counts
// 1 and 2, each a target plus a frozen draft, both with the non-idempotent shuffle layout) and
// `mpirun -np 4 weightcast-train --tp 2 --pp 2`. Paths come from compile definitions.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sync/trainer/http/engine_client.h"
#include "tests/support/subprocess.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::sync::trainer {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using weightcast::testing::Subprocess;

using Engine = testing::TestEngine;
using testing::count_matches;
using testing::start_engine;
using testing::start_trainer;

EngineClient client(const Engine& e) {
  return testing::test_client(e.url);
}

// The path engine `e`'s /metrics reports for group "weightcast-pp_0", polled while the trainer
// runs (it leaves the group on exit); "" when it never shows within `timeout`.
std::string engine_data_path(const Engine& e, milliseconds timeout) {
  const std::regex re(
      R"re(weightcast_engine_group_data_path\{group="weightcast-pp_0",path="([a-z-]+)"\} 1)re");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string metrics = client(e).metrics();
    if (std::regex_search(metrics, m, re)) return m[1].str();
    std::this_thread::sleep_for(milliseconds(20));
  }
  return "";
}

TEST(TrainerE2E, AutoSelectsTargetAndVerifiesOnMixedEngines) {
  std::vector<Engine> engines;
  engines.push_back(start_engine(1));
  engines.push_back(start_engine(2));
  // The chain's path (same-host engines would take the colocated one by default).
  auto trainer = start_trainer(
      engines, {"--steps", "3", "--verify", "--bucket-bytes", "256K", "--colocate", "off"});
  std::vector<std::string> engine_paths;
  for (const auto& e : engines) engine_paths.push_back(engine_data_path(e, milliseconds(60000)));
  const auto code = trainer->wait(seconds(90));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  EXPECT_EQ(count_matches(out, "selector target \\(auto"), 1) << out;
  for (int step = 1; step <= 3; ++step) {
    const std::string line = "step " + std::to_string(step) + "/3 version " + std::to_string(step) +
                             " selector target bytes [0-9]+ .* buckets " +
                             "[0-9]+ seconds [0-9.]+ GB/s [0-9.]+ verified yes";
    EXPECT_EQ(count_matches(out, line), 1) << out;
  }
  for (const auto& e : engines) EXPECT_EQ(client(e).server_info().weight_version, "3");
  // The path the group agreed on is on every step line and in every engine's /metrics, the same
  // (one host: single copy where processes may read each other's memory, else the chain).
  std::smatch path;
  ASSERT_TRUE(std::regex_search(out, path, std::regex("step 3/3 .* path (single-copy|chain)")))
      << out;
  for (const auto& p : engine_paths) EXPECT_EQ(p, path[1].str());
}

TEST(TrainerE2E, SelectorAllOnLegacyEnginesFailsVerificationNamingTheDraft) {
  std::vector<Engine> engines;
  engines.push_back(start_engine(1, {"--legacy-finalize"}));
  engines.push_back(start_engine(2, {"--legacy-finalize"}));
  auto trainer = start_trainer(engines, {"--steps", "3", "--verify", "--selector", "all"});
  const auto code = trainer->wait(seconds(90));
  const std::string out = trainer->drain(seconds(5));
  EXPECT_EQ(code, std::optional<int>(1)) << out;
  EXPECT_EQ(count_matches(out, "step 1/3 VERIFY FAILED version 1: .*runner draft tensor draft\\."),
            1)
      << out;
  EXPECT_EQ(count_matches(out, "step 2/3"), 0) << out;
}

TEST(TrainerE2E, KilledEngineFailsTheUpdateNamingItAndTheOtherKeepsItsVersion) {
  std::vector<Engine> engines;
  engines.push_back(start_engine(1));
  engines.push_back(start_engine(2));
  // Small buckets and a pause after each make an update last several seconds. The overlapped
  // gather (not the default): its thread must end with the failed step, not hang the job.
  auto trainer =
      start_trainer(engines, {"--steps", "3", "--bucket-bytes", "64K", "--bucket-delay-ms", "60",
                              "--update-timeout-ms", "20000", "--request-timeout-ms", "10000",
                              "--tp-gather", "overlap"});
  ASSERT_TRUE(trainer->wait_for_line("step 1/3 version 1", seconds(60))) << trainer->output();
  const auto before = client(engines[0]).weights_checksum(Runner::kTarget);
  ASSERT_EQ(before.weight_version, "1");

  std::this_thread::sleep_for(milliseconds(500));  // well inside step 2
  engines[1].process->signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  const auto code = trainer->wait(seconds(60));
  const auto took = std::chrono::steady_clock::now() - killed_at;
  const std::string out = trainer->drain(seconds(5));
  EXPECT_EQ(code, std::optional<int>(1)) << out;
  // Bounded by the trainer's own deadlines (update 20 s), not by the test's.
  EXPECT_LT(took, seconds(30)) << out;
  EXPECT_EQ(count_matches(out, "step 2/3 FAILED version 2: .*" +
                                   std::regex_replace(engines[1].url, std::regex("[.]"), "\\.")),
            1)
      << out;

  const auto after = client(engines[0]).weights_checksum(Runner::kTarget);
  EXPECT_EQ(after.weight_version, "1");
  EXPECT_EQ(after.digest, before.digest);
}

TEST(TrainerE2E, ExampleUpdatesAnEngine) {
  Engine engine = start_engine(1, {}, /*seed=*/0);
  Subprocess example({WEIGHTCAST_EXAMPLE_BIN, engine.url});
  const auto code = example.wait(seconds(60));
  const std::string out = example.drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  EXPECT_EQ(count_matches(out, "selector target\n"), 1) << out;
  EXPECT_EQ(count_matches(out, "update [12]: version [12] selector target tensors 21 "), 2) << out;
  EXPECT_EQ(client(engine).server_info().weight_version, "2");
}

// "accept_length a,b" values of the line that starts with `prefix`.
std::vector<double> accept_lengths(const std::string& out, const std::string& prefix) {
  std::vector<double> values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    auto at = line.find("accept_length ");
    if (at == std::string::npos) continue;
    std::istringstream list(line.substr(at + 14));
    for (std::string v; std::getline(list, v, ',');) values.push_back(std::stod(v));
  }
  return values;
}

// The accept-length probe, end to end: well above 1 and steady with the fixed behaviour; about 1
// as soon as the old finalize shuffles the frozen draft a second time.
TEST(TrainerE2E, AcceptLengthStaysUpWhenFixedAndFallsToOneWithTheOldFinalize) {
  std::vector<Engine> fixed;
  fixed.push_back(start_engine(1));
  fixed.push_back(start_engine(2));
  auto good = start_trainer(fixed, {"--steps", "2", "--verify", "--probe-accept-length"});
  const auto good_code = good->wait(seconds(120));
  const std::string good_out = good->drain(seconds(5));
  ASSERT_EQ(good_code, std::optional<int>(0)) << good_out;
  const auto step0 = accept_lengths(good_out, "step 0/2 initial weights");
  const auto step2 = accept_lengths(good_out, "step 2/2 version");
  ASSERT_EQ(step0.size(), 2u) << good_out;
  ASSERT_EQ(step2.size(), 2u) << good_out;
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_GT(step0[e], 2.0) << good_out;
    EXPECT_NEAR(step2[e], step0[e], 0.25 * step0[e]) << good_out;
  }

  std::vector<Engine> legacy;
  legacy.push_back(start_engine(1, {"--legacy-finalize"}));
  legacy.push_back(start_engine(2, {"--legacy-finalize"}));
  auto bad = start_trainer(legacy, {"--steps", "1", "--verify", "--keep-going", "--selector", "all",
                                    "--probe-accept-length"});
  const auto bad_code = bad->wait(seconds(120));
  const std::string bad_out = bad->drain(seconds(5));
  EXPECT_EQ(bad_code, std::optional<int>(1)) << bad_out;
  const auto after = accept_lengths(bad_out, "step 1/1 version");
  ASSERT_EQ(after.size(), 2u) << bad_out;
  for (double a : after) EXPECT_LT(a, 1.2) << bad_out;
  EXPECT_EQ(count_matches(bad_out, "draft_ok no"), 1) << bad_out;
}

}  // namespace
}  // namespace weightcast::sync::trainer

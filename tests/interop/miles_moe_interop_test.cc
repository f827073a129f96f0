// The Miles-style torch trainer (tests/interop/miles_style_trainer.py) against two weightcast
// engines holding a mixture of experts (moe-tiny): it sends the non-expert buckets first and the
// expert buckets after them, as Miles does after its expert-parallel all-gather, and the engines
// take them unchanged: after 3 updates every target tensor, each expert's included, has the
// XXH3-128 of what torch sent.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
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
  Subprocess trainer({testing::torch_python(), testing::interop_script("miles_style_trainer.py"),
                      "--engines", engines[0].url + "," + engines[1].url, "--ranks", "1,2",
                      "--steps", "3", "--selector", "target", "--timeout", "60"},
                     testing::torch_env());
  const std::string output = trainer.drain(seconds(180));
  ASSERT_EQ(trainer.wait(seconds(10)), 0) << output;
  std::vector<Json> steps;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"step\"", 0) == 0) steps.push_back(Json::parse(line));
  }
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

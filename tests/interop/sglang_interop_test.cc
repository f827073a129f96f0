// weightcast-train drives an SGLang-shaped engine (tests/interop/sglang_style_engine.py: SGLang's
// routes and answers, torch.distributed receive per tensor or as the unpadded flattened bucket)
// together with a weightcast-engine in the same group: the trainer detects the flavors, hosts a
// torch store (1.x generation, what this machine's torch speaks) and runs the common mode.
//   MixedFlavor/*: mpirun -np 4 --tp 2 --pp 2, 3 steps; both engines hold identical bytes for
//                  every target tensor, the weightcast engine's frozen draft is untouched.
//   WeightcastOnly: the same model to two weightcast engines, for the GB/s comparison.
//   Faults/*:      the SGLang-style engine answers success:false mid-session, never answers a
//                  bucket, or 404s begin: the trainer fails within its deadlines naming that
//                  engine, and the weightcast engine commits nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "sync/trainer/engine_client.h"
#include "tests/interop/torch_python.h"
#include "tests/support/engine_launch.h"
#include "tests/support/subprocess.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::interop {
namespace {

using Json = nlohmann::json;
using std::chrono::seconds;
using weightcast::testing::Subprocess;

using Peer = sync::trainer::testing::TestEngine;

// A weightcast engine whose target keeps the bytes as sent (its digests are the sent bytes').
Peer start_weightcast(int ranks) {
  auto argv =
      testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks, 5,
                                {"--init-timeout-ms", "30000", "--session-timeout-ms", "60000"});
  testing::set_flag_value(argv, "--target-layout", "none");
  return sync::trainer::testing::start_engine_process(argv);
}

Peer start_sglang(const std::string& digests, const std::string& fault = "none") {
  Peer p{std::make_unique<Subprocess>(
             std::vector<std::string>{testing::torch_python(),
                                      testing::interop_script("sglang_style_engine.py"),
                                      "--digests", digests, "--fault", fault, "--timeout", "30"},
             testing::torch_env()),
         ""};
  auto url = p.process->wait_for_line("sglang-style engine listening on ", seconds(60));
  if (!url) throw std::runtime_error("sglang-style engine did not start: " + p.process->output());
  p.url = *url;
  return p;
}

struct TrainRun {
  int code = -1;
  std::string output;
  double seconds = 0;
};

// mpirun -np <np> weightcast-train <args>, bounded by `limit`; stderr folded into stdout.
TrainRun train(int np, const std::vector<Peer*>& engines, const std::vector<std::string>& args,
               seconds limit) {
  std::vector<std::string> urls;
  for (const auto* e : engines) urls.push_back(e->url);
  std::vector<std::string> train_args = {"--torch-store", "torch1"};
  train_args.insert(train_args.end(), args.begin(), args.end());
  const auto start = std::chrono::steady_clock::now();
  const auto trainer = sync::trainer::testing::start_trainer(np, urls, train_args);
  TrainRun run;
  run.output = trainer->drain(limit);
  run.code = trainer->wait(seconds(10)).value_or(-1);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

double mean_gbps(const std::string& output) {
  const std::regex re(R"(GB/s ([0-9.]+))");
  double sum = 0;
  int n = 0;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it, ++n) {
    sum += std::stod((*it)[1]);
  }
  return n ? sum / n : 0;
}

sync::trainer::EngineClient client(const std::string& url) {
  return sync::trainer::testing::test_client(url);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "-" + std::to_string(::getpid()) + ".json";
}

const std::vector<std::string> kThreeSteps = {
    "--tp", "2", "--pp", "2", "--steps", "3", "--selector", "target", "--group-timeout-ms",
    "30000"};

class MixedFlavor : public ::testing::TestWithParam<const char*> {};

TEST_P(MixedFlavor, BothEnginesHoldIdenticalBytesForEveryTargetTensor) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  const std::string digests = temp_path("sglang-digests");
  Peer sglang = start_sglang(digests);
  Peer wc = start_weightcast(2);
  const std::string draft = client(wc.url).weights_checksum(sync::Runner::kDraft).digest;
  auto args = kThreeSteps;
  args.insert(args.end(), {"--common-format", GetParam()});
  const TrainRun run = train(4, {&sglang, &wc}, args, seconds(180));
  ASSERT_EQ(run.code, 0) << run.output;
  for (int s = 1; s <= 3; ++s) {
    EXPECT_NE(run.output.find("step " + std::to_string(s) + "/3 version"), std::string::npos);
  }
  std::printf("mixed flavors (%s): mean update GB/s %.4f\n", GetParam(), mean_gbps(run.output));
  RecordProperty("update_gbps", std::to_string(mean_gbps(run.output)));

  std::ifstream in(digests);
  const Json held = Json::parse(in);
  const auto target = client(wc.url).weights_checksum(sync::Runner::kTarget);
  EXPECT_EQ(held["weight_version"], target.weight_version);
  EXPECT_EQ(target.weight_version, "3");
  ASSERT_FALSE(target.tensors.empty());
  for (const auto& t : target.tensors) {
    ASSERT_TRUE(held["digests"].contains(t.name)) << t.name << " never reached the SGLang engine";
    EXPECT_EQ(held["digests"][t.name].get<std::string>(), t.digest) << t.name;
  }
  EXPECT_EQ(client(wc.url).weights_checksum(sync::Runner::kDraft).digest, draft);
}

INSTANTIATE_TEST_SUITE_P(Interop, MixedFlavor, ::testing::Values("per_tensor", "flattened_bucket"));

TEST(WeightcastOnly, SameModelForTheComparison) {
  Peer a = start_weightcast(1);
  Peer b = start_weightcast(2);
  const TrainRun run = train(4, {&a, &b}, kThreeSteps, seconds(180));
  ASSERT_EQ(run.code, 0) << run.output;
  std::printf("weightcast only: mean update GB/s %.4f\n", mean_gbps(run.output));
  RecordProperty("update_gbps", std::to_string(mean_gbps(run.output)));
}

struct Fault {
  const char* name;
  const char* route;  // what the trainer's error must name
};

void PrintTo(const Fault& f, std::ostream* os) {
  *os << f.name;
}

class Faults : public ::testing::TestWithParam<Fault> {};

TEST_P(Faults, BoundedFailureNamingTheEngineNothingCommittedElsewhere) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  Peer sglang = start_sglang(temp_path("sglang-fault"), GetParam().name);
  Peer wc = start_weightcast(1);
  const auto before = client(wc.url).weights_checksum(sync::Runner::kTarget);
  const TrainRun run =
      train(1, {&sglang, &wc},
            {"--steps", "1", "--selector", "target", "--bucket-bytes", "1M", "--request-timeout-ms",
             "4000", "--update-timeout-ms", "6000", "--group-timeout-ms", "8000"},
            seconds(90));
  EXPECT_NE(run.code, 0) << run.output;
  EXPECT_LT(run.seconds, 45.0) << run.output;
  EXPECT_NE(run.output.find(sglang.url), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(GetParam().route), std::string::npos) << run.output;
  // SGLang cannot drop what it loaded: the report says that engine needs a new group and reload.
  EXPECT_NE(run.output.find("needs a fresh group and a full reload"), std::string::npos)
      << run.output;
  const auto after = client(wc.url).weights_checksum(sync::Runner::kTarget);
  EXPECT_EQ(after.digest, before.digest) << "the weightcast engine committed part of it";
  EXPECT_EQ(after.weight_version, before.weight_version);
}

INSTANTIATE_TEST_SUITE_P(Interop, Faults,
                         ::testing::Values(Fault{"success_false",
                                                 "update_weights_from_distributed"},
                                           Fault{"never_answer", "update_weights_from_distributed"},
                                           Fault{"begin_404", "begin_weight_update"}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace weightcast::interop

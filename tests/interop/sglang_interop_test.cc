// weightcast-train drives an SGLang-shaped engine (tests/interop/sglang_style_engine.py: SGLang's
// routes and answers, torch.distributed receive per tensor or as the unpadded flattened bucket)
// together with a weightcast-engine in the same group: the trainer detects the flavors, hosts a
// torch store whose generation it learns from the torch engine's first request (1.x here: no
// --torch-store flag is passed) and runs the common mode.
//   MixedFlavor/*: mpirun -np 4 --tp 2 --pp 2, 3 steps; both engines hold identical bytes for
//                  every target tensor, the weightcast engine's frozen draft is untouched.
//   WeightcastOnly: the same model to two weightcast engines, for the GB/s comparison.
//   Sessionless:   the SGLang-style engine is a slime-era build (begin answers 404): the trainer
//                  updates it without sessions, each bucket carrying the version.
//   Faults/*:      the SGLang-style engine answers 400 mid-session or never answers a bucket: the
//                  trainer fails within its deadlines naming that engine, the weightcast engine
//                  commits nothing, and the SGLang one, holding part of the update, stays paused.
//   HalfUpdated:   the same with --sglang-reload-path: reloaded from the checkpoint, then resumed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
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

using Peer = sync::trainer::testing::TestEngine;

// A weightcast engine whose target keeps the bytes as sent (its digests are the sent bytes').
Peer start_weightcast(int ranks) {
  auto argv =
      testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks, 5,
                                {"--init-timeout-ms", "30000", "--session-timeout-ms", "60000"});
  testing::set_flag_value(argv, "--target-layout", "none");
  return sync::trainer::testing::start_engine_process(argv);
}

Peer start_sglang(const std::string& digests, const std::string& fault = "none",
                  bool sessions = true) {
  std::vector<std::string> argv = {testing::torch_python(),
                                   testing::interop_script("sglang_style_engine.py"),
                                   "--digests",
                                   digests,
                                   "--fault",
                                   fault,
                                   "--timeout",
                                   "30"};
  if (!sessions) argv.push_back("--no-sessions");
  Peer p{std::make_unique<Subprocess>(argv, testing::torch_env()), ""};
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
  const auto start = std::chrono::steady_clock::now();
  const auto trainer = sync::trainer::testing::start_trainer(np, urls, args);
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

// The SGLang-style engine's digest file holds, at `version`, exactly what the weightcast engine's
// target holds.
void expect_same_bytes(const std::string& digests, const Peer& wc, const std::string& version) {
  std::ifstream in(digests);
  const Json held = Json::parse(in);
  const auto target = client(wc.url).weights_checksum(sync::Runner::kTarget);
  EXPECT_EQ(held["weight_version"], target.weight_version);
  EXPECT_EQ(target.weight_version, version);
  ASSERT_FALSE(target.tensors.empty());
  for (const auto& t : target.tensors) {
    ASSERT_TRUE(held["digests"].contains(t.name)) << t.name << " never reached the SGLang engine";
    EXPECT_EQ(held["digests"][t.name].get<std::string>(), t.digest) << t.name;
  }
}

// GET `path` of `url` as JSON (null when it does not answer 200 with JSON).
Json get_json(const std::string& url, const std::string& path) {
  httplib::Client http(url);
  http.set_connection_timeout(std::chrono::seconds(5));
  http.set_read_timeout(std::chrono::seconds(10));
  auto res = http.Get(path);
  if (!res || res->status != 200) return Json();
  return Json::parse(res->body, nullptr, /*allow_exceptions=*/false);
}

// The stand-in's own state ("stand_in" in its /get_server_info).
Json stand_in_state(const Peer& sglang) {
  return get_json(sglang.url, "/get_server_info").value("stand_in", Json());
}

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

  expect_same_bytes(digests, wc, "3");
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
                         ::testing::Values(Fault{"fail_400", "update_weights_from_distributed"},
                                           Fault{"never_answer",
                                                 "update_weights_from_distributed"}),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(Sessionless, SlimeEraSGLangIsUpdatedWithoutSessionsBesideAWeightcastEngine) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  const std::string digests = temp_path("sglang-sessionless");
  Peer sglang = start_sglang(digests, "none", /*sessions=*/false);
  Peer wc = start_weightcast(2);
  const TrainRun run = train(4, {&sglang, &wc}, kThreeSteps, seconds(180));
  ASSERT_EQ(run.code, 0) << run.output;
  expect_same_bytes(digests, wc, "3");
}

// The routes the trainer called on `sglang`, in order, against `per_update` repeated `steps`
// times after destroy (its 400 ignored) and init.
void expect_calls(const Peer& sglang, const std::vector<const char*>& per_update, int steps) {
  Json expected = {"/destroy_weights_update_group", "/init_weights_update_group"};
  for (int s = 0; s < steps; ++s) {
    for (const char* route : per_update) expected.push_back(route);
  }
  const Json calls = stand_in_state(sglang)["calls"];
  ASSERT_GE(calls.size(), expected.size()) << calls.dump();  // then it leaves the group on exit
  EXPECT_EQ(
      Json(std::vector<Json>(calls.begin(), calls.begin() + static_cast<long>(expected.size()))),
      expected)
      << calls.dump();
}

TEST(MilesOrder, TheTrainersSGLangFlavorSendsMilesSequenceExactly) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  Peer sglang = start_sglang(temp_path("sglang-order"));
  const TrainRun run = train(1, {&sglang},
                             {"--steps", "2", "--selector", "target", "--pause-mode", "retract",
                              "--group-timeout-ms", "30000"},
                             seconds(120));
  ASSERT_EQ(run.code, 0) << run.output;
  expect_calls(sglang,
               {"/pause_generation", "/flush_cache", "/begin_weight_update",
                "/update_weights_from_distributed", "/update_weight_version", "/end_weight_update",
                "/continue_generation"},
               2);
}

TEST(Sessionless, ForcedSGLangFlavorFallsBackWhenBeginAnswers404) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  const std::string digests = temp_path("sglang-forced");
  Peer sglang = start_sglang(digests, "none", /*sessions=*/false);
  const TrainRun run = train(1, {&sglang},
                             {"--engine-flavor", "sglang", "--steps", "2", "--selector", "target",
                              "--group-timeout-ms", "30000"},
                             seconds(120));
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(digests);
  const Json held = Json::parse(in);
  EXPECT_EQ(held["weight_version"], "2");
  EXPECT_FALSE(held["digests"].empty());
  EXPECT_EQ(stand_in_state(sglang)["paused"], false);
  // slime's order: no session, no update_weight_version (each bucket carries the version).
  expect_calls(sglang,
               {"/pause_generation", "/flush_cache", "/begin_weight_update",
                "/update_weights_from_distributed", "/continue_generation"},
               1);
}

// A failed update after buckets reached the SGLang engine: it must not generate on what it
// holds. Without a checkpoint it stays paused (and is reported); with one it is reloaded, then
// resumed.
class HalfUpdated : public ::testing::TestWithParam<bool> {};

TEST_P(HalfUpdated, StaysPausedOrIsReloadedThenResumed) {
  if (testing::torch_python().empty()) GTEST_SKIP() << testing::torch_missing_reason();
  const bool reload = GetParam();
  Peer sglang = start_sglang(temp_path("sglang-half"), "fail_400");
  Peer wc = start_weightcast(1);
  std::vector<std::string> args = {"--steps",        "1",  "--selector",         "target",
                                   "--bucket-bytes", "1M", "--group-timeout-ms", "30000"};
  if (reload) args.insert(args.end(), {"--sglang-reload-path", "/checkpoints/step-0"});
  const TrainRun run = train(1, {&sglang, &wc}, args, seconds(120));
  EXPECT_NE(run.code, 0) << run.output;
  const Json state = stand_in_state(sglang);
  if (reload) {
    EXPECT_EQ(state["reloads"], Json::array({"/checkpoints/step-0"})) << run.output;
    EXPECT_EQ(state["paused"], false) << run.output;
    EXPECT_NE(run.output.find("reloaded from the checkpoint and resumed"), std::string::npos)
        << run.output;
  } else {
    EXPECT_EQ(state["reloads"], Json::array()) << run.output;
    EXPECT_EQ(state["paused"], true) << run.output;
    EXPECT_EQ(state["continues"], 0) << run.output;
    EXPECT_NE(run.output.find("stays paused"), std::string::npos) << run.output;
  }
  EXPECT_EQ(get_json(wc.url, "/server_info")["paused"], false) << "the weightcast engine was not "
                                                                  "resumed";
}

INSTANTIATE_TEST_SUITE_P(Interop, HalfUpdated, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Reload" : "NoReload"; });

}  // namespace
}  // namespace weightcast::interop

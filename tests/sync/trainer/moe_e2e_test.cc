// Mixture of experts end to end, real processes on loopback with Gloo: two weightcast-engine
// processes (1 and 2 ranks) holding moe-tiny, and `mpirun -np 8 weightcast-train --tp 2 --ep 2
// --pp 2` (oversubscribed). Three updates with --verify; then every expert tensor each engine holds
// must equal, bit for bit, the generator's step-3 bytes that the EP ranks held: EP rank 1's
// experts reach the engines only through its own shards (EP rank 0 never generates them).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "launcher/cli_util.h"
#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"
#include "sync/trainer/http/engine_client.h"
#include "tests/support/engine_http.h"
#include "tests/support/engine_launch.h"
#include "tests/support/subprocess.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::sync::trainer {
namespace {

using std::chrono::seconds;
using weightcast::testing::Subprocess;

constexpr int kSeed = 5;

testing::TestEngine start_moe_engine(int ranks, const std::string& model, int ep_size = 1) {
  auto argv = weightcast::testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks, kSeed);
  weightcast::testing::set_flag_value(argv, "--model", model);
  weightcast::testing::set_flag_value(argv, "--port", "0");
  if (ep_size > 1) {
    argv.push_back("--ep-size");
    argv.push_back(std::to_string(ep_size));
  }
  return testing::start_engine_process(argv);
}

// `mpirun -np <np> weightcast-train --seed 5 --engines <urls> <args>` (the shared launcher fixes
// --model tiny; these runs choose their model).
std::unique_ptr<Subprocess> start_trainer(int np, const std::vector<testing::TestEngine>& engines,
                                          const std::vector<std::string>& args) {
  std::string list;
  for (const auto& e : engines) list += (list.empty() ? "" : ",") + e.url;
  std::string command = "exec " + std::string(WEIGHTCAST_MPIEXEC);
  for (const auto& f : weightcast::launcher::split_any(WEIGHTCAST_MPIRUN_FLAGS, "| ")) {
    command += " " + f;
  }
  command += " -np " + std::to_string(np) + " " + std::string(WEIGHTCAST_TRAIN_BIN) + " --seed " +
             std::to_string(kSeed) + " --engines " + list;
  for (const auto& a : args) command += " " + a;
  return std::make_unique<Subprocess>(std::vector<std::string>{"/bin/sh", "-c", command + " 2>&1"});
}

// Checks every expert tensor of the engine's target runner against the generator at `step`;
// returns how many it checked.
int expect_experts_at_step(const testing::TestEngine& engine, const ModelSpec& spec,
                           std::uint64_t step) {
  auto client = testing::test_client(engine.url);
  Layout layout = Layout::kNone;
  for (const auto& runner : client.server_info().runners) {
    if (runner.name == Runner::kTarget) layout = parse_layout(runner.layout);
  }
  const auto answer = client.weights_checksum(Runner::kTarget, /*recompute=*/true);
  std::map<std::string, std::string> held;
  for (const auto& t : answer.tensors) held[t.name] = t.digest;
  int checked = 0;
  for (const auto& meta : target_tensors(spec)) {
    if (meta.name.find(".mlp.experts.") == std::string::npos) continue;
    std::vector<std::byte> bytes(meta.byte_count());
    fill_tensor(meta, kSeed, step, bytes);
    apply_layout(layout, meta, bytes);
    const auto it = held.find(meta.name);
    if (it == held.end()) {
      ADD_FAILURE() << engine.url << " does not hold " << meta.name;
      continue;
    }
    EXPECT_EQ(it->second, to_string(tensor_digest(bytes))) << engine.url << " " << meta.name;
    ++checked;
  }
  return checked;
}

TEST(MoeE2E, Tp2Ep2Pp2UpdatesTwoEnginesWithEveryExpertBitExact) {
  const ModelSpec spec = model_preset("moe-tiny");
  std::vector<testing::TestEngine> engines;
  engines.push_back(start_moe_engine(1, "moe-tiny"));
  // The 2-rank engine runs with expert parallelism, and says so as SGLang does.
  engines.push_back(start_moe_engine(2, "moe-tiny", /*ep_size=*/2));
  const nlohmann::json info =
      weightcast::testing::EngineHttp(engines[1].url).get("/server_info").body;
  EXPECT_EQ(info["ep_size"], 2);
  EXPECT_EQ(info["expert_placement"],
            nlohmann::json::array({"experts [0, 4) of 8 (ep 2, rank 0, linear)",
                                   "experts [4, 8) of 8 (ep 2, rank 1, linear)"}));
  auto trainer = start_trainer(8, engines,
                               {"--model", "moe-tiny", "--tp", "2", "--ep", "2", "--pp", "2",
                                "--steps", "3", "--verify", "--bucket-bytes", "256K"});
  const auto code = trainer->wait(seconds(150));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  // The EP path ran: the coordinator reports how the experts are spread.
  EXPECT_EQ(testing::count_matches(out, "experts 8 ep 2 \\(local\\): 4 per EP rank"), 1) << out;
  // --tp-gather auto: every rank is on this host, so the whole stage is gathered first.
  EXPECT_EQ(testing::count_matches(out, "stage gather whole \\(auto\\)"), 1) << out;
  for (int step = 1; step <= 3; ++step) {
    EXPECT_EQ(testing::count_matches(out, "step " + std::to_string(step) + "/3 version " +
                                              std::to_string(step) + " .* verified yes"),
              1)
        << out;
  }
  for (const auto& e : engines) {
    // 2 layers x 8 experts x gate, up, down.
    EXPECT_EQ(expect_experts_at_step(e, spec, 3), 48) << e.url;
  }
}

// DeepSeek style (MLA, a dense layer, shared experts) with the grouped expert layout, EP 4 and a
// bucket size (600K) that would cut the MLA down projections of layers 0 and 1 apart without the
// atomic-group rule. The EP ranks' experts join the overlapped gather here (--tp-gather
// overlap); the test above takes the default, auto, which gathers the whole stage before the
// update on one host.
TEST(MoeE2E, DeepSeekStyleGroupedLayoutEp4WithAtomicGroups) {
  const ModelSpec spec = model_preset("deepseek-tiny");
  std::vector<testing::TestEngine> engines;
  engines.push_back(start_moe_engine(1, "deepseek-tiny"));
  auto trainer = start_trainer(
      4, engines,
      {"--model", "deepseek-tiny", "--ep", "4", "--expert-layout", "grouped", "--steps", "2",
       "--verify", "--bucket-bytes", "600K", "--tp-gather", "overlap"});
  const auto code = trainer->wait(seconds(120));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  EXPECT_EQ(testing::count_matches(out, "experts 8 ep 4 \\(grouped\\): 2 per EP rank"), 1) << out;
  EXPECT_EQ(testing::count_matches(out, "step 2/2 version 2 .* verified yes"), 1) << out;
  EXPECT_EQ(expect_experts_at_step(engines[0], spec, 2), 2 * 8 * 3);
}

TEST(MoeE2E, BucketTooSmallForAnAtomicGroupFailsBeforeAnyUpdate) {
  std::vector<testing::TestEngine> engines;
  engines.push_back(start_moe_engine(1, "deepseek-tiny"));
  const std::string before = testing::test_client(engines[0].url).server_info().weight_version;
  auto trainer = start_trainer(
      1, engines, {"--model", "deepseek-tiny", "--steps", "1", "--bucket-bytes", "80K"});
  const auto code = trainer->wait(seconds(60));
  const std::string out = trainer->drain(seconds(5));
  EXPECT_NE(code, std::optional<int>(0)) << out;
  EXPECT_EQ(
      testing::count_matches(
          out, "atomic group 'model\\.layers\\.0\\.self_attn\\.\\{q_a_proj,kv_a_proj_with_mqa\\}'"),
      1)
      << out;
  EXPECT_EQ(testing::test_client(engines[0].url).server_info().weight_version, before);
}

}  // namespace
}  // namespace weightcast::sync::trainer

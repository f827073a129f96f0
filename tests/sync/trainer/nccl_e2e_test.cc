// The single-node NCCL update (device suite, `ctest -R Nccl`): weightcast-train's source and a
// one-rank engine on one machine, each on its own GPU — the engine started at --base-gpu-id 1 (as
// SGLang's base_gpu_id), the trainer's source on --cuda-device 0 — three verified updates over
// --backend nccl, with delta updates forced on (the base and the payloads travel through device
// memory). Skips with the reason without two CUDA devices; WEIGHTCAST_REQUIRE_CUDA_DEVICES (set
// by scripts/gpu-check.sh) turns that skip into a failure.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

#include "tests/comm/nccl/nccl_test_util.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::sync::trainer {
namespace {

using std::chrono::seconds;
using testing::count_matches;
using testing::start_engine;
using testing::start_trainer;

TEST(NcclE2E, TrainerAndEngineOnOneMachineEachOnItsOwnGpu) {
  std::string why;
  try {
    why = comm::nccl_testing::cuda_skip_reason(2);
  } catch (const std::runtime_error& e) {
    FAIL() << e.what();
  }
  if (!why.empty()) GTEST_SKIP() << why;
  const auto engine = start_engine(1, {"--base-gpu-id", "1"});
  auto trainer =
      start_trainer(1, {engine.url},
                    {"--steps", "3", "--verify", "--backend", "nccl", "--cuda-device", "0",
                     "--bucket-bytes", "256K", "--drift", "realistic", "--delta", "on"});
  const auto code = trainer->wait(seconds(120));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  for (int step = 1; step <= 3; ++step) {
    EXPECT_EQ(count_matches(out, "step " + std::to_string(step) + "/3 version " +
                                     std::to_string(step) + " .* verified yes"),
              1)
        << out;
  }
  EXPECT_EQ(count_matches(out, "delta_buckets [1-9]"), 2) << "steps 2 and 3 send deltas: " << out;
  EXPECT_EQ(testing::test_client(engine.url).server_info().weight_version, "3");
}

}  // namespace
}  // namespace weightcast::sync::trainer

// The colocated path end to end, real processes on one host: two weightcast-engine processes
// (rank counts 1 and 2, each a target plus a frozen draft, both with the non-idempotent shuffle
// layout) and `mpirun -np 4 weightcast-train --tp 2 --pp 2 --colocate ...`. --verify compares
// every engine's bytes with what was sent: with the shuffle layout a finish run twice (or on the
// draft) shows as a mismatch, so "verified yes" is also "post-processing ran once". Each test
// also checks /dev/shm: a colocated update leaves nothing there, faults included.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_memory.h"
#include "sync/trainer/http/engine_client.h"
#include "tests/support/subprocess.h"
#include "tests/sync/engine/colocate_util.h"
#include "tests/sync/trainer/train_launch.h"
#include "weightcast/config.h"

#if WEIGHTCAST_HAVE_NCCL
#include "tests/comm/nccl/nccl_test_util.h"
#endif

namespace weightcast::sync::trainer {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using weightcast::testing::Subprocess;

using Engine = testing::TestEngine;
using engine::testing::mapped_segments;
using engine::testing::shm_entries;
using testing::count_matches;
using testing::regex_escape;
using testing::start_engine;
using testing::start_trainer;

EngineClient client(const Engine& e) {
  return testing::test_client(e.url);
}

// Sends `sig` to every child of `parent` (mpirun's ranks, which it starts in groups of their own).
void kill_children(pid_t parent, int sig) {
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
      std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      const auto close = text.rfind(')');  // "pid (comm) state ppid ..."
      if (close == std::string::npos) continue;
      std::istringstream fields(text.substr(close + 1));
      std::string state;
      pid_t ppid = 0;
      if (fields >> state >> ppid && ppid == parent) ::kill(pid, sig);
    }
    ::closedir(d);
  }
}

// A 1-rank and a 2-rank engine, `extra` flags on the second.
std::vector<Engine> two_engines(const std::vector<std::string>& second_extra = {}) {
  std::vector<Engine> engines;
  engines.push_back(start_engine(1));
  engines.push_back(start_engine(2, second_extra));
  return engines;
}

// Three verified steps through --colocate on with `delta` (and `extra` flags): every engine takes
// the colocated path, the target bytes are exact, the draft does not change, nothing is left in
// /dev/shm; with `device_segments`, no engine holds a memfd segment mapped.
void three_verified_colocated_steps(const std::string& delta,
                                    const std::vector<std::string>& extra = {},
                                    bool device_segments = false) {
  const std::size_t shm_before = shm_entries();
  auto engines = two_engines();
  std::vector<std::string> drafts;
  for (const auto& e : engines) drafts.push_back(client(e).weights_checksum(Runner::kDraft).digest);
  std::vector<std::string> args{"--steps", "3",   "--verify",       "--colocate", "on",
                                "--delta", delta, "--bucket-bytes", "256K"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto trainer = start_trainer(engines, args);
  const auto code = trainer->wait(seconds(90));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  for (const auto& e : engines) {
    EXPECT_EQ(count_matches(out, "engine " + regex_escape(e.url) +
                                     " flavor weightcast path "
                                     "colocated"),
              1)
        << out;
  }
  for (int step = 1; step <= 3; ++step) {
    const std::string line = "step " + std::to_string(step) + "/3 version " + std::to_string(step) +
                             " selector target .* verified yes target_ok yes draft_ok yes .* "
                             "delta_buckets 0 path colocated ";
    EXPECT_EQ(count_matches(out, line), 1) << out;
  }
  for (std::size_t i = 0; i < engines.size(); ++i) {
    const auto info = client(engines[i]).server_info();
    EXPECT_EQ(info.weight_version, "3");
    EXPECT_FALSE(info.session_selector.has_value());
    EXPECT_EQ(client(engines[i]).weights_checksum(Runner::kDraft).digest, drafts[i]);
    // The engine's own recomputation of what it holds agrees with what it stored at commit.
    const auto stored = client(engines[i]).weights_checksum(Runner::kTarget);
    EXPECT_EQ(client(engines[i]).weights_checksum(Runner::kTarget, true).digest, stored.digest);
    // Engines keep a memfd segment's mapping between updates; a device segment's handle is
    // closed before each answer: none kept is how the device form shows it travelled as one.
    if (device_segments) {
      EXPECT_EQ(mapped_segments(engines[i].process->pid()), 0u);
    }
  }
  EXPECT_EQ(shm_entries(), shm_before);
}

TEST(ColocateE2E, TpPpTrainerUpdatesOneAndTwoRankEnginesVerifiedDeltaOff) {
  three_verified_colocated_steps("off");
}

TEST(ColocateE2E, TpPpTrainerUpdatesOneAndTwoRankEnginesVerifiedDeltaOn) {
  three_verified_colocated_steps("on");
}

// auto: the engine that offers the path takes it, the one started with --no-colocate takes the
// chain, in the same update; the step line names both.
TEST(ColocateE2E, AutoMixesColocatedAndChainEnginesInOneUpdate) {
  auto engines = two_engines({"--no-colocate"});
  auto trainer = start_trainer(engines, {"--steps", "2", "--verify", "--colocate", "auto",
                                         "--delta", "on", "--bucket-bytes", "256K"});
  const auto code = trainer->wait(seconds(90));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  EXPECT_EQ(count_matches(out, "engine " + regex_escape(engines[0].url) + " .* path colocated"), 1)
      << out;
  EXPECT_EQ(count_matches(out, "engine " + regex_escape(engines[1].url) + " .* path chain"), 1)
      << out;
  // Step 2 sends deltas on the chain (its engine confirmed version 1); the colocated engine
  // copies full buckets. Both verify.
  EXPECT_EQ(count_matches(out, "step 1/2 .* verified yes .* path (single-copy|chain)\\+colocated "),
            1)
      << out;
  EXPECT_EQ(count_matches(out,
                          "step 2/2 .* verified yes .* delta_buckets [1-9][0-9]* path "
                          "(single-copy|chain)\\+colocated "),
            1)
      << out;
  // The engine without the path refuses a colocated bucket outright.
  for (const auto& e : engines) EXPECT_EQ(client(e).server_info().weight_version, "2");
  EXPECT_FALSE(client(engines[1]).server_info().colocate_host.has_value());
}

// The device form (docs/colocated.md, "On GPUs"): the buckets travel in device segments as CUDA
// IPC handles, the engines copy them out on their GPU. Skips without a CUDA device;
// scripts/gpu-check.sh runs it (`ctest -R Nccl`) with WEIGHTCAST_REQUIRE_CUDA_DEVICES, where a
// skip fails.
TEST(NcclColocateCudaE2E, TpPpTrainerUpdatesEnginesThroughDeviceSegmentsVerified) {
#if WEIGHTCAST_HAVE_NCCL
  if (const std::string why = comm::nccl_testing::cuda_skip_reason(1); !why.empty()) {
    GTEST_SKIP() << why;
  }
  three_verified_colocated_steps("off", {"--colocate-memory", "cuda"}, /*device_segments=*/true);
#else
  GTEST_SKIP() << "built without CUDA (WEIGHTCAST_WITH_NCCL)";
#endif
}

// A trainer run with `args` against one engine started with `engine_extra` exits with an error
// naming `why` before any step, and the engine keeps its version.
void fails_before_any_update(const std::vector<std::string>& engine_extra,
                             const std::vector<std::string>& args, const std::string& why) {
  std::vector<Engine> engines;
  engines.push_back(start_engine(1, engine_extra));
  const std::string version = client(engines[0]).server_info().weight_version;
  auto trainer = start_trainer(engines, args);
  const auto code = trainer->wait(seconds(60));
  const std::string out = trainer->drain(seconds(5));
  EXPECT_NE(code, std::optional<int>(0)) << out;
  EXPECT_GE(count_matches(out, why), 1) << out;
  EXPECT_EQ(count_matches(out, "step 1/1 version"), 0) << out;
  EXPECT_EQ(client(engines[0]).server_info().weight_version, version);
}

// Without a CUDA device, --colocate-memory cuda stops before any update, saying why.
TEST(ColocateE2E, CudaMemoryWithoutADeviceFailsBeforeAnyUpdate) {
  if (std::string why; comm::cuda_device_count(&why) > 0) {
    GTEST_SKIP() << "a CUDA device is here: NcclColocateCudaE2E runs the update";
  }
  fails_before_any_update({}, {"--steps", "1", "--colocate", "on", "--colocate-memory", "cuda"},
                          "colocate memory cuda: no CUDA device");
}

TEST(ColocateE2E, OnWithNoEngineOfferingItFailsBeforeAnyUpdate) {
  fails_before_any_update({"--no-colocate"}, {"--steps", "1", "--colocate", "on"},
                          "colocate on: no engine takes colocated buckets");
}

// Small buckets and a pause after each make an update last seconds; an engine killed inside
// step 2 fails it, naming the engine, and the other keeps version 1 byte for byte.
TEST(ColocateE2E, KilledEngineMidUpdateFailsTheStepAndTheOtherKeepsItsVersion) {
  const std::size_t shm_before = shm_entries();
  auto engines = two_engines();
  auto trainer = start_trainer(
      engines, {"--steps", "3", "--colocate", "on", "--bucket-bytes", "64K", "--bucket-delay-ms",
                "60", "--update-timeout-ms", "20000", "--request-timeout-ms", "10000"});
  ASSERT_TRUE(trainer->wait_for_line("step 1/3 version 1", seconds(60))) << trainer->output();
  const auto before = client(engines[0]).weights_checksum(Runner::kTarget);
  ASSERT_EQ(before.weight_version, "1");
  std::this_thread::sleep_for(milliseconds(500));  // well inside step 2
  engines[1].process->signal(SIGKILL);
  const auto code = trainer->wait(seconds(60));
  const std::string out = trainer->drain(seconds(5));
  EXPECT_EQ(code, std::optional<int>(1)) << out;
  EXPECT_EQ(count_matches(out, "step 2/3 FAILED version 2: .*" + regex_escape(engines[1].url)), 1)
      << out;
  const auto after = client(engines[0]).weights_checksum(Runner::kTarget);
  EXPECT_EQ(after.weight_version, "1");
  EXPECT_EQ(after.digest, before.digest);
  EXPECT_EQ(shm_entries(), shm_before);
}

// The whole trainer job killed inside step 2: nothing of it is committed anywhere, and the
// segments it held are gone with it: not in /dev/shm, and no longer mapped by any engine (each
// keeps its mapping of the trainer's arena between updates while the trainer lives).
TEST(ColocateE2E, KilledTrainerMidUpdateLeavesEveryEngineOnItsVersion) {
  const std::size_t shm_before = shm_entries();
  auto engines = two_engines();
  auto trainer = start_trainer(engines, {"--steps", "3", "--colocate", "on", "--bucket-bytes",
                                         "64K", "--bucket-delay-ms", "60"});
  ASSERT_TRUE(trainer->wait_for_line("step 1/3 version 1", seconds(60))) << trainer->output();
  std::vector<std::string> digests;
  for (const auto& e : engines)
    digests.push_back(client(e).weights_checksum(Runner::kTarget).digest);
  std::this_thread::sleep_for(milliseconds(500));  // well inside step 2
  for (const auto& e : engines) EXPECT_GE(mapped_segments(e.process->pid()), 1u);
  // The ranks die, as a crashed job's do; mpirun itself sees them go and cleans up after them.
  kill_children(trainer->pid(), SIGKILL);
  trainer->wait(seconds(30));
  for (std::size_t i = 0; i < engines.size(); ++i) {
    const auto held = client(engines[i]).weights_checksum(Runner::kTarget);
    EXPECT_EQ(held.weight_version, "1");
    EXPECT_EQ(held.digest, digests[i]);
  }
  EXPECT_EQ(shm_entries(), shm_before);
  const auto until = steady_clock::now() + seconds(30);
  for (const auto& e : engines) {
    while (mapped_segments(e.process->pid()) > 0 && steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    EXPECT_EQ(mapped_segments(e.process->pid()), 0u) << e.url;
  }
}

}  // namespace
}  // namespace weightcast::sync::trainer

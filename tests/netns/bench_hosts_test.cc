// weightcast-bench hosts between network namespaces: the trainer's expert-parallel stage across
// hosts (launcher/bench/hosts_ep.h: mpirun reaches the EP ranks' namespaces through the bench's
// netns agent, the expert gather crosses the shaped links, and every --tp-gather mode updates
// engines in hosts of their own with every step verified; auto picks the overlap, since the stage
// spans hosts), the shard-aware broadcast, and the whole sharded update against torch engines
// whose workers are hosts of their own. Needs network namespaces (skipped otherwise).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/netns/netns_topology.h"
#include "tests/support/subprocess.h"

#ifndef WEIGHTCAST_BENCH_BIN
#error "WEIGHTCAST_BENCH_BIN must name the weightcast-bench executable"
#endif

namespace weightcast::testing {
namespace {

using namespace std::chrono_literals;

// Runs weightcast-bench with `args` and --json, expecting it to exit 0 within `timeout` with no
// wrong bytes on any row; returns its JSON (discarded when it wrote none) and its output in `out`.
nlohmann::json run_bench(std::vector<std::string> args, std::chrono::seconds timeout,
                         std::string& out) {
  const std::string json = "/tmp/weightcast-bench-hosts-test-" + std::to_string(getpid());
  args.insert(args.begin(), WEIGHTCAST_BENCH_BIN);
  args.insert(args.end(), {"--json", json});
  Subprocess bench(args);
  const auto rc = bench.wait_exit(timeout);
  out = bench.drain(1s);
  std::ifstream in(json);
  auto result = nlohmann::json::parse(in, nullptr, false);
  std::remove(json.c_str());
  EXPECT_EQ(rc, 0) << out;
  if (!result.is_discarded()) {
    for (const auto& row : result["rows"]) {
      EXPECT_EQ(row["#wrong"].get<std::uint64_t>(), 0u) << row.dump();
    }
  }
  return result;
}

TEST(BenchHosts, TrainerEpStageAcrossHostsVerifiesEveryStepInEveryGatherMode) {
  if (auto why = netns_unavailable_reason()) GTEST_SKIP() << *why;
  std::string out;
  const auto result = run_bench({"hosts",
                                 "--receivers",
                                 "1",
                                 "--bytes",
                                 "1M",
                                 "--iters",
                                 "1",
                                 "--rate",
                                 "2gbit",
                                 "--trainer-ep",
                                 "2",
                                 "--trainer-model",
                                 "moe-tiny",
                                 "--trainer-bucket-bytes",
                                 "1M",
                                 "--trainer-steps",
                                 "2",
                                 "--trainer-engines",
                                 "2",
                                 "--trainer-gathers",
                                 "whole,overlap,auto",
                                 "--timeout-ms",
                                 "60000"},
                                150s, out);
  ASSERT_FALSE(result.is_discarded()) << out;
  std::set<std::string> rows;
  for (const auto& row : result["rows"]) rows.insert(row["what"].get<std::string>());
  for (const char* mode : {"whole", "overlap", "auto"}) {
    for (int step = 1; step <= 2; ++step) {
      EXPECT_TRUE(rows.count("ep2 " + std::string(mode) + " step " + std::to_string(step)))
          << mode << " step " << step << " missing:\n"
          << out;
    }
  }
  // Both modes compared, and auto picked the overlap: the stage's ranks are on two hosts.
  bool ratio = false, auto_overlap = false;
  for (const auto& note : result["notes"]) {
    const std::string text = note.get<std::string>();
    ratio = ratio || text.find("the speed of whole") != std::string::npos;
    auto_overlap = auto_overlap || text.find("--tp-gather auto (ran overlap)") != std::string::npos;
  }
  EXPECT_TRUE(ratio) << out;
  EXPECT_TRUE(auto_overlap) << out;
}

// Shard-aware against full broadcast (launcher/bench/hosts_shard.h): every rank a host of its own,
// each checking the bytes of its slices; a rank receives exactly what its plan keeps, half the
// model at TP 2 and a quarter plus the KV heads two ranks share at TP 4. Times are not asserted.
TEST(BenchHosts, ShardedBroadcastGivesEachRankItsSlices) {
  if (auto why = netns_unavailable_reason()) GTEST_SKIP() << *why;
  std::string out;
  const auto result =
      run_bench({"hosts", "--receivers", "4", "--bytes", "4M", "--iters", "1", "--rate", "2gbit",
                 "--shard-tps", "1,2,4", "--shard-bucket-bytes", "1M", "--timeout-ms", "60000"},
                90s, out);
  ASSERT_FALSE(result.is_discarded()) << out;
  std::set<std::string> rows;
  for (const auto& row : result["rows"]) rows.insert(row["what"].get<std::string>());
  for (const char* row : {"full broadcast", "sharded TP-1", "sharded TP-2", "sharded TP-4"}) {
    EXPECT_TRUE(rows.count(row)) << row << " missing:\n" << out;
  }
  std::map<int, std::array<unsigned long long, 3>> bytes;  // received, plan, formula
  for (const auto& note : result["notes"]) {
    int tp = 0;
    unsigned long long got = 0, plan = 0, formula = 0;
    const std::string text = note.get<std::string>();
    const auto at = text.find("received at most ");
    if (std::sscanf(text.c_str(), "TP-%d ", &tp) == 1 && at != std::string::npos &&
        std::sscanf(text.c_str() + at,
                    "received at most %llu B = %*f of the model (its plan: "
                    "%llu B; sharded/TP + replicated: %llu B)",
                    &got, &plan, &formula) == 3) {
      bytes[tp] = {got, plan, formula};
    }
  }
  ASSERT_EQ(bytes.size(), 3u) << out;
  for (const auto& [tp, b] : bytes) {
    EXPECT_EQ(b[0], b[1]) << "TP-" << tp << ": a rank received other than its plan keeps";
  }
  EXPECT_EQ(bytes[2][0], bytes[2][2]) << "TP-2: half the sharded bytes plus the replicated ones";
  EXPECT_EQ(bytes[1][0], bytes[1][2]) << "TP-1: the whole model";
  EXPECT_LT(bytes[4][0], bytes[2][0]) << out;
  EXPECT_GE(bytes[4][0], bytes[4][2]) << out;
}

// The whole update, sliced against full (launcher/bench/hosts_shard_update.h): weightcast-train
// updates a TP-2 torch engine whose two workers run in hosts of their own, with --shard off and
// then auto, every step verified (the bench fails otherwise). Each worker's received bytes come
// from the engine itself: with --shard off every worker received the whole model each step, with
// auto at most its half plus the replicated norms. Times are not asserted.
TEST(BenchHosts, ShardedUpdateSendsEachWorkerItsSlices) {
  if (auto why = netns_unavailable_reason()) GTEST_SKIP() << *why;
  const std::string python = WEIGHTCAST_PYTHON;
  if (python.empty() || std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "no interpreter here imports torch (" << python << ")";
  }
  std::string out;
  const auto result = run_bench({"hosts", "--receivers",
                                 "2",     "--bytes",
                                 "1M",    "--iters",
                                 "1",     "--rate",
                                 "2gbit", "--shard-update-tps",
                                 "2",     "--shard-update-model",
                                 "tiny",  "--shard-update-steps",
                                 "2",     "--shard-bucket-bytes",
                                 "1M",    "--python",
                                 python,  "--timeout-ms",
                                 "60000"},
                                150s, out);
  ASSERT_FALSE(result.is_discarded()) << out;
  std::set<std::string> rows;
  for (const auto& row : result["rows"]) rows.insert(row["what"].get<std::string>());
  for (const char* row :
       {"upd full tp2 s1", "upd full tp2 s2", "upd sliced tp2 s1", "upd sliced tp2 s2"}) {
    EXPECT_TRUE(rows.count(row)) << row << " missing:\n" << out;
  }
  unsigned long long sliced = 0, full = 0;
  for (const auto& note : result["notes"]) {
    const std::string text = note.get<std::string>();
    const auto at = text.find("a worker received at most ");
    if (at != std::string::npos) {
      ASSERT_EQ(std::sscanf(text.c_str() + at,
                            "a worker received at most %llu B per step sliced (%*f of the model), "
                            "%llu B full",
                            &sliced, &full),
                2)
          << text;
    }
  }
  std::uint64_t model = 0;
  for (const auto& row : result["rows"]) {
    if (row["what"] == "upd full tp2 s1") model = row["bytes"].get<std::uint64_t>();
  }
  ASSERT_GT(model, 0u) << out;
  EXPECT_EQ(full, model) << out;  // every worker, the whole model each step
  // Its half of each sharded tensor, and the norms whole.
  EXPECT_GT(sliced, model / 2) << out;
  EXPECT_LT(sliced, model * 11 / 20) << out;
}

}  // namespace
}  // namespace weightcast::testing

// weightcast-bench hosts with the trainer's expert-parallel stage across hosts
// (launcher/bench/hosts_ep.h): mpirun reaches the EP ranks' namespaces through the bench's netns
// agent, the expert gather crosses the shaped links, and every --tp-gather mode updates engines in
// hosts of their own with every step verified; auto picks the overlap, since the stage spans hosts.
// Needs network namespaces (skipped otherwise).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "tests/netns/netns_topology.h"
#include "tests/support/subprocess.h"

#ifndef WEIGHTCAST_BENCH_BIN
#error "WEIGHTCAST_BENCH_BIN must name the weightcast-bench executable"
#endif

namespace weightcast::testing {
namespace {

using namespace std::chrono_literals;

TEST(BenchHosts, TrainerEpStageAcrossHostsVerifiesEveryStepInEveryGatherMode) {
  if (auto why = netns_unavailable_reason()) GTEST_SKIP() << *why;
  const std::string json = "/tmp/weightcast-bench-hosts-test-" + std::to_string(getpid());
  Subprocess bench({WEIGHTCAST_BENCH_BIN,
                    "hosts",
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
                    "60000",
                    "--json",
                    json});
  const auto rc = bench.wait_exit(150s);
  const std::string out = bench.drain(1s);
  std::ifstream in(json);
  const auto result = nlohmann::json::parse(in, nullptr, false);
  std::remove(json.c_str());
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(result.is_discarded()) << out;
  std::set<std::string> rows;
  for (const auto& row : result["rows"]) {
    EXPECT_EQ(row["#wrong"].get<std::uint64_t>(), 0u) << row.dump();
    rows.insert(row["what"].get<std::string>());
  }
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

}  // namespace
}  // namespace weightcast::testing

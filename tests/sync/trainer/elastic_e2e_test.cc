// The elastic engine set end to end, real processes: three engines (1, 2 and 1 ranks) and
// `mpirun -np 2 weightcast-train --pp 2 --steps 30 --on-engine-failure drop --verify`. Engine c
// is SIGKILLed in the update after step 5 and restarted on the same port after step 10; engine b
// is SIGSTOPped in the update after step 15, for 10 s. Both faults land mid-update: the test
// polls the engine's /server_info every 5 ms and signals once it reports a session open (a step
// every 0.65 s: 0.6 s of simulated training, then the update). Training never stops, every step
// verifies on the engines in the set, both come back (re-admitted with a full update) and all
// three end at version 30 with identical digests. The test prints the timeline it measured
// (docs/reliability.md, case 13, quotes it).
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/engine_launch.h"
#include "tests/sync/trainer/train_launch.h"

namespace weightcast::sync::trainer::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using weightcast::testing::Subprocess;

constexpr int kSteps = 30;

// The trainer's step lines with the time each arrived.
class StepLog {
 public:
  explicit StepLog(Subprocess& trainer) : trainer_(trainer), start_(Clock::now()) {}

  // Reads until the line of step `step` arrived (true) or `timeout` passed / the trainer ended.
  bool until_step(int step, milliseconds timeout) {
    const std::string prefix = "step " + std::to_string(step) + "/" + std::to_string(kSteps) + " ";
    const auto deadline = Clock::now() + timeout;
    for (const auto& l : lines_) {
      if (l.text.rfind(prefix, 0) == 0) return true;
    }
    while (Clock::now() < deadline) {
      auto line = trainer_.read_line(
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()) + milliseconds(1));
      if (!line) return false;
      lines_.push_back({now(), *line});
      if (line->rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  // Keeps reading lines until `until` (the trainer keeps running meanwhile).
  void read_until(Clock::time_point until) {
    while (Clock::now() < until) {
      auto line = trainer_.read_line(
          std::chrono::duration_cast<milliseconds>(until - Clock::now()) + milliseconds(1));
      if (!line) return;
      lines_.push_back({now(), *line});
    }
  }
  // Every step line, with its time and the engine-set part ("engines current ...").
  void print() const {
    for (const auto& l : lines_) {
      if (l.text.rfind("step ", 0) != 0) continue;
      const auto at = l.text.find(" engines current");
      const auto space = l.text.find(' ', 5);
      std::printf("  %5.1f s %s%s\n", l.t, l.text.substr(0, space).c_str(),
                  at == std::string::npos ? "" : l.text.substr(at).c_str());
    }
  }
  double now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // The first step line matching `pattern`: its step number and arrival time.
  std::optional<std::pair<int, double>> first(const std::string& pattern) const {
    const std::regex re(pattern);
    const std::regex step_re("^step ([0-9]+)/");
    for (const auto& l : lines_) {
      std::smatch m;
      if (std::regex_search(l.text, re) && std::regex_search(l.text, m, step_re)) {
        return std::make_pair(std::stoi(m[1]), l.t);
      }
    }
    return std::nullopt;
  }

 private:
  struct Line {
    double t;
    std::string text;
  };
  Subprocess& trainer_;
  Clock::time_point start_;
  std::vector<Line> lines_;
};

// Polls /server_info until the engine reports a session open (an update in progress there), so
// the fault lands mid-update rather than between steps; false at the deadline.
bool wait_for_session(const std::string& url, milliseconds timeout) {
  EngineClient client = test_client(url);
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (client.server_info().session_selector.has_value()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

// SIGCONTs a stopped engine on every way out, so its destructor's SIGKILL ends a running one.
struct Resume {
  Subprocess* process = nullptr;
  ~Resume() {
    if (process) process->signal(SIGCONT);
  }
};

// The trainer's flags: drop failed engines, probe them back quickly, verify every step.
std::vector<std::string> elastic_trainer_flags() {
  return {"--tp",
          "1",
          "--pp",
          "2",
          "--steps",
          std::to_string(kSteps),
          "--on-engine-failure",
          "drop",
          "--verify",
          "--bucket-bytes",
          "256K",
          "--step-interval-ms",
          "600",
          "--connect-timeout-ms",
          "1000",
          "--request-timeout-ms",
          "2000",
          "--update-timeout-ms",
          "4000",
          "--group-timeout-ms",
          "4000",
          "--probe-timeout-ms",
          "1000",
          "--probe-backoff-max-steps",
          "4",
          "--mpi-timeout-ms",
          "30000"};
}

// When each fault happened, in seconds since the trainer started.
struct Timeline {
  double killed = 0, restarted = 0, stopped = 0, resumed = 0;
  int port = 0;
};

// Every step committed and verified on the engines of its set; c and b left and came back after
// their faults; step 30 had all three.
void expect_membership(const std::string& out, const StepLog& log, const std::string& b,
                       const std::string& c, const Timeline& tl) {
  for (int step = 1; step <= kSteps; ++step) {
    const std::string s = std::to_string(step);
    EXPECT_EQ(count_matches(out, "step " + s + "/30 version " + s +
                                     " .*verified yes target_ok "
                                     "yes .*engines current [1-3]/3"),
              1)
        << out;
  }
  const auto c_left = log.first("dropped " + regex_escape(c) + " \\(");
  const auto c_back = log.first("readmitted 1 \\(" + regex_escape(c) + "\\)");
  const auto b_left = log.first("dropped " + regex_escape(b) + " \\(");
  const auto b_back = log.first("readmitted 1 \\(" + regex_escape(b) + "\\)");
  ASSERT_TRUE(c_left && c_back && b_left && b_back) << out;
  EXPECT_GT(c_left->first, 5);
  EXPECT_GT(c_back->first, 10);
  EXPECT_GT(b_left->first, 15);
  EXPECT_GT(b_back->first, b_left->first);
  EXPECT_EQ(count_matches(out, "step 30/30 .*engines current 3/3 dropped 0"), 1) << out;
  std::printf(
      "elastic timeline (seconds since the trainer started):\n"
      "  c SIGKILLed in step 6 at %.1f s; left the set at step %d (%.1f s)\n"
      "  c restarted on port %d at %.1f s; re-admitted at step %d (%.1f s): %.1f s after restart\n"
      "  b SIGSTOPped in step 16 at %.1f s; left the set at step %d (%.1f s)\n"
      "  b SIGCONTed at %.1f s; re-admitted at step %d (%.1f s): %.1f s after SIGCONT\n"
      "  step 30 at %.1f s\n",
      tl.killed, c_left->first, c_left->second, tl.port, tl.restarted, c_back->first,
      c_back->second, c_back->second - tl.restarted, tl.stopped, b_left->first, b_left->second,
      tl.resumed, b_back->first, b_back->second, b_back->second - tl.resumed,
      log.first("^step 30/30 ")->second);
}

// All engines at the final version, bit-identical, target and draft.
void expect_all_identical(const std::vector<TestEngine>& engines) {
  std::vector<std::string> target, draft;
  for (const auto& e : engines) {
    EngineClient client = test_client(e.url);
    const auto t = client.weights_checksum(Runner::kTarget);
    EXPECT_EQ(t.weight_version, "30") << e.url;
    target.push_back(t.digest);
    draft.push_back(client.weights_checksum(Runner::kDraft).digest);
  }
  EXPECT_EQ(target[0], target[1]);
  EXPECT_EQ(target[0], target[2]);
  EXPECT_EQ(draft[0], draft[1]);
  EXPECT_EQ(draft[0], draft[2]);
}

TEST(ElasticE2E, KilledRestartedAndStoppedEnginesLeaveAndRejoinWhileTrainingGoesOn) {
  std::vector<TestEngine> engines;
  engines.push_back(start_engine(1));
  engines.push_back(start_engine(2));
  engines.push_back(start_engine(1));
  const std::string b = engines[1].url, c = engines[2].url;
  auto trainer = start_trainer(2, {engines[0].url, b, c}, elastic_trainer_flags());
  StepLog log(*trainer);
  Resume resume;
  Timeline tl;

  ASSERT_TRUE(log.until_step(5, milliseconds(60000))) << trainer->output();
  ASSERT_TRUE(wait_for_session(c, milliseconds(10000))) << trainer->output();
  engines[2].process->signal(SIGKILL);
  engines[2].process->wait(seconds(10));
  tl.killed = log.now();

  ASSERT_TRUE(log.until_step(10, milliseconds(60000))) << trainer->output();
  // The same port: the URL the trainer knows. The port is the one this engine bound first.
  tl.port = weightcast::testing::url_port(c);
  engines[2] = start_engine(1, {}, 5, tl.port);
  ASSERT_EQ(engines[2].url, c);
  tl.restarted = log.now();

  ASSERT_TRUE(log.until_step(15, milliseconds(60000))) << trainer->output();
  ASSERT_TRUE(wait_for_session(b, milliseconds(10000))) << trainer->output();
  engines[1].process->signal(SIGSTOP);
  resume.process = engines[1].process.get();
  tl.stopped = log.now();
  log.read_until(Clock::now() + seconds(10));  // the fault lasts 10 s; training goes on
  engines[1].process->signal(SIGCONT);
  resume.process = nullptr;
  tl.resumed = log.now();

  ASSERT_TRUE(log.until_step(kSteps, milliseconds(90000))) << trainer->output();
  const auto code = trainer->wait(seconds(30));
  const std::string out = trainer->drain(seconds(5));
  ASSERT_EQ(code, std::optional<int>(0)) << out;

  expect_membership(out, log, b, c, tl);
  expect_all_identical(engines);
  log.print();
}

}  // namespace
}  // namespace weightcast::sync::trainer::testing

// Case 3 of the fault list: the trainer (the broadcast's source, a process of its own) dies or
// freezes in the middle of an update. Engines must drop the session within their own deadline,
// keep their previous weights and version, leave no pause behind, and the next trainer run must
// update them normally.
//
// SIGKILL: the kernel closes the trainer's sockets, so the engines' pending bucket receive fails
// at once (a peer failure); nobody should wait for a deadline. SIGSTOP: the sockets stay open and
// silent, so only --comm-timeout-ms can end the pending receive: the session must end in [0.5x,
// 2x] of it. Either way the pause the trainer took is lifted after --session-timeout-ms without
// any request (the trainer that would have resumed generation is gone), and its lease on the
// engines ends after its time to live.
#include <signal.h>

#include <gtest/gtest.h>

#include <sstream>

#include "tests/faults/fault_support.h"
#include "tests/support/time_bounds.h"

#ifndef WEIGHTCAST_FAULT_TRAINER_BIN
#error "WEIGHTCAST_FAULT_TRAINER_BIN must name the fault trainer executable"
#endif

namespace weightcast::faults {
namespace {

using namespace std::chrono_literals;
using weightcast::testing::Subprocess;

const std::string kGroup = "weightcast-pp_0";

std::unique_ptr<Subprocess> start_trainer(const std::vector<std::string>& urls, int steps,
                                          Millis bucket_delay) {
  return std::make_unique<Subprocess>(std::vector<std::string>{
      WEIGHTCAST_FAULT_TRAINER_BIN, "--engines", urls[0] + "," + urls[1], "--steps",
      std::to_string(steps), "--bucket-delay-ms", std::to_string(bucket_delay.count())});
}

// The signal the trainer gets (a struct, so gtest prints its name).
struct TrainerSignal {
  int sig;
};

void PrintTo(const TrainerSignal& s, std::ostream* os) {
  *os << (s.sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
}

// When engine `e` dropped the dead trainer's session and lifted its pause, from the signal.
struct DropTiming {
  Clock::time_point signalled;
  std::optional<Clock::time_point> dropped;
  std::optional<Clock::time_point> resumed;
};

// Engine `e` ended the session by its deadline (or at once, when the trainer's sockets closed),
// unpaused within its session timeout after that, and kept version 1.
void check_engine_after_trainer_died(std::size_t e, const std::string& url,
                                     const EngineConfig& config, int sig, Millis deadline,
                                     const DropTiming& timing) {
  ASSERT_TRUE(timing.dropped.has_value()) << "engine " << e << " kept the dead trainer's session";
  ASSERT_TRUE(timing.resumed.has_value()) << "engine " << e << " stayed paused";
  const double drop_ms = ms_between(timing.signalled, *timing.dropped);
  const double resume_ms = ms_between(timing.signalled, *timing.resumed);
  const double d = static_cast<double>(deadline.count());
  if (sig == SIGSTOP) {
    EXPECT_GE(drop_ms, 0.5 * d) << "engine " << e << ": not ended by its deadline";
    EXPECT_LE(drop_ms, testing::late_bound_ms(d)) << "engine " << e;
  } else {
    EXPECT_LT(drop_ms, 0.5 * d) << "engine " << e << " waited although the trainer's sockets "
                                << "closed";
  }
  // The pause is lifted once nothing was heard for the session timeout after the drop.
  EXPECT_LE(resume_ms,
            drop_ms + testing::late_bound_ms(static_cast<double>(config.session_timeout.count())))
      << "engine " << e;
  const auto g = http_get(url, "/server_info").body;
  std::string reason;
  for (const auto& group : g.value("groups", nlohmann::json::array())) {
    reason = group.value("abort_reason", "");
  }
  std::ostringstream fig;
  fig << "case=3 fault=trainer_" << (sig == SIGKILL ? "SIGKILL" : "SIGSTOP") << " engine=" << e
      << " session_dropped_ms=" << static_cast<long>(drop_ms) << " deadline_ms=" << deadline.count()
      << " ratio=" << drop_ms / d << " unpaused_ms=" << static_cast<long>(resume_ms)
      << " session_timeout_ms=" << config.session_timeout.count()
      << " error=" << (reason.find("timed out") != std::string::npos ? "timeout" : "peer");
  figure(fig.str());
  expect_engine_at(url, 1, "engine " + std::to_string(e) + " after the trainer died");
}

class TrainerFault : public ::testing::TestWithParam<TrainerSignal> {};

TEST_P(TrainerFault, EnginesDropTheSessionInTimeKeepWeightsUnpauseAndTheNextRunRecovers) {
  const int sig = GetParam().sig;
  std::vector<EngineConfig> configs(2);
  configs[1].ranks = 2;
  // The dead trainer's lease keeps other trainers out for its time to live (docs/protocol.md,
  // "Leases"): short here, so it has passed by the time the engines unpause and the next run
  // begins.
  for (auto& c : configs) c.extra = {"--lease-ttl-s", "1"};
  if (sig == SIGKILL) {
    // "Without waiting for a deadline" is told apart from waiting for it, under load, only against
    // a long deadline; a passing run does not wait for it.
    for (auto& c : configs) c.comm_timeout = testing::kFastFailureDeadline;
  }
  std::vector<std::unique_ptr<EnginePeer>> engines;
  for (const auto& c : configs) engines.push_back(std::make_unique<EnginePeer>(c));
  const std::vector<std::string> urls = {engines[0]->url(), engines[1]->url()};

  auto trainer = start_trainer(urls, 3, 80ms);
  ASSERT_TRUE(trainer->wait_for_line("update 1 ok", 30s)) << trainer->output();
  const auto info = http_get(urls[0], "/server_info");
  const std::uint64_t base = buckets_received(info.body, kGroup);
  ASSERT_TRUE(wait_engine(
      urls[0], [&](const nlohmann::json& j) { return buckets_received(j, kGroup) >= base + 3; },
      20s))
      << "the second update never reached its fourth bucket: " << trainer->output();
  const auto t0 = Clock::now();
  trainer->signal(sig);

  // The session's end is bounded by the bucket receive (comm timeout) when the trainer is
  // silent, and by nothing at all when its sockets closed.
  const Millis deadline = configs[0].comm_timeout;
  std::vector<std::future<std::optional<Clock::time_point>>> dropped, resumed;
  for (const auto& url : urls) {
    dropped.push_back(watch_engine(
        url, [](const nlohmann::json& j) { return !j.value("in_session", true); }, 4 * deadline));
    resumed.push_back(watch_engine(
        url, [](const nlohmann::json& j) { return !j.value("paused", true); },
        4 * configs[0].session_timeout + 4 * deadline));
  }
  for (std::size_t e = 0; e < urls.size(); ++e) {
    const DropTiming timing{t0, dropped[e].get(), resumed[e].get()};
    check_engine_after_trainer_died(e, urls[e], configs[e], sig, deadline, timing);
    if (HasFatalFailure()) return;
  }
  trainer.reset();  // SIGKILLs a stopped trainer too

  auto next = start_trainer(urls, 1, 0ms);
  const auto code = next->wait(60s);
  const std::string out = next->drain(5s);
  ASSERT_EQ(code, std::optional<int>(0)) << out;
  EXPECT_NE(out.find("update 2 ok"), std::string::npos) << out;
  for (const auto& url : urls) expect_engine_at(url, 2, "after the next trainer run");
}

INSTANTIATE_TEST_SUITE_P(Faults, TrainerFault,
                         ::testing::Values(TrainerSignal{SIGKILL}, TrainerSignal{SIGSTOP}),
                         [](const ::testing::TestParamInfo<TrainerSignal>& param) {
                           return std::string(param.param.sig == SIGKILL ? "Kill" : "Stop");
                         });

}  // namespace
}  // namespace weightcast::faults

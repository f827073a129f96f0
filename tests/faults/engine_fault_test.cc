// Cases 1 and 2 of the fault list: an engine SIGKILLed, or SIGSTOPped (alive but silent), in the
// middle of an update. Real processes on loopback with Gloo: engine A (1 rank) and engine B
// (2 ranks), so the broadcast chain is trainer -> A -> B0 -> B1; the trainer is this process,
// driving a DistributedUpdater with a pause after each bucket so an update lasts about a second.
// The victim is A (inside the chain: peers on both sides) or B (its end).
//
// "Mid-bucket": the victim has staged at least three buckets of the update and holds the request
// of the next one open (the trainer announces bucket k+1 before it broadcasts bucket k, so an
// engine is always inside a bucket receive during the data phase).
//
// Bounds, per survivor, against the deadline that governs it (engines: --comm-timeout-ms;
// trainer: its data-phase timeout):
//   SIGSTOP: only a deadline can reveal a silent peer, so the error must come in
//            [0.5x, 2x] of it, typed as a timeout;
//   SIGKILL: the kernel closes the victim's sockets, so the error must come before 0.5x of any
//            deadline (nobody waits one out) and is a peer failure, not a timeout.
#include <signal.h>

#include <gtest/gtest.h>

#include <sstream>

#include "tests/faults/fault_support.h"
#include "tests/support/time_bounds.h"

namespace weightcast::faults {
namespace {

using namespace std::chrono_literals;

const std::string kGroup = "weightcast-pp_0";

enum class Fault { kKill, kStop };

struct Param {
  Fault fault;
  std::size_t victim;  // 0: A, inside the chain; 1: B, its end
};

std::string name_of(const Param& p) {
  return std::string(p.fault == Fault::kKill ? "Kill" : "Stop") +
         (p.victim == 0 ? "ChainMiddle" : "ChainEnd");
}

void PrintTo(const Param& p, std::ostream* os) {
  *os << name_of(p);
}

// How an engine's failure was typed, from the reason its group was aborted with.
std::string failure_type(const std::string& reason) {
  if (reason.find("timed out") != std::string::npos) return "timeout";
  if (reason.find("abort_weight_update") != std::string::npos) return "aborted_by_trainer";
  if (reason.find("closed") != std::string::npos || reason.find("connection") != std::string::npos)
    return "peer";
  return reason.empty() ? "none" : "other";
}

nlohmann::json group_of(const nlohmann::json& info) {
  for (const auto& g : info.value("groups", nlohmann::json::array())) {
    if (g.value("group_name", "") == kGroup) return g;
  }
  return nlohmann::json::object();
}

void expect_within(Fault fault, double ms, Millis deadline, const std::string& who) {
  const double d = static_cast<double>(deadline.count());
  if (fault == Fault::kStop) {
    EXPECT_GE(ms, 0.5 * d) << who << " failed before half its deadline: not by the deadline";
    EXPECT_LE(ms, testing::late_bound_ms(d)) << who << " failed long after its deadline";
  } else {
    EXPECT_LT(ms, 0.5 * d) << who << " waited for a deadline although the peer's sockets closed";
    EXPECT_GE(d, static_cast<double>(testing::kFastFailureDeadline.count())) << "too short to tell";
  }
}

class EngineFault : public ::testing::TestWithParam<Param> {};

TEST_P(EngineFault, SurvivorsFailTypedInBoundedTimeKeepTheirWeightsAndANewUpdateRestoresAll) {
  const Param p = GetParam();
  const std::size_t survivor = 1 - p.victim;
  const std::string fault_name = p.fault == Fault::kKill ? "SIGKILL" : "SIGSTOP";
  std::vector<EngineConfig> configs(2);
  configs[1].ranks = 2;
  TrainerConfig tc;
  tc.bucket_delay = 80ms;
  if (p.fault == Fault::kKill) {
    // "Without waiting for a deadline" is told apart from waiting for it, under load, only against
    // a long deadline; a passing run does not wait for it.
    for (auto& c : configs) c.comm_timeout = testing::kFastFailureDeadline;
    tc.data_timeout = testing::kFastFailureDeadline;
  }
  std::vector<std::unique_ptr<EnginePeer>> engines;
  for (const auto& c : configs) engines.push_back(std::make_unique<EnginePeer>(c));
  auto urls = [&] { return std::vector<std::string>{engines[0]->url(), engines[1]->url()}; };
  const Millis engine_deadline = configs[survivor].comm_timeout;

  auto updater = make_updater(urls(), tc);
  const auto first = updater->update(views_at(1));
  ASSERT_TRUE(first.ok) << sync::trainer::summary(first);
  for (const auto& e : engines) expect_engine_at(e->url(), 1, "after the first update");

  EnginePeer& victim = *engines[p.victim];
  const std::string victim_url = victim.url();
  const std::string survivor_url = engines[survivor]->url();
  const auto before = http_get(victim_url, "/server_info");
  ASSERT_EQ(before.status, 200);
  const std::uint64_t base = buckets_received(before.body, kGroup);

  auto pending = std::async(std::launch::async, [&] { return updater->update(views_at(2)); });
  ASSERT_TRUE(wait_engine(
      victim_url, [&](const nlohmann::json& j) { return buckets_received(j, kGroup) >= base + 3; },
      20s))
      << "the update never reached its fourth bucket";
  const auto t0 = Clock::now();
  victim.signal(p.fault == Fault::kKill ? SIGKILL : SIGSTOP);

  auto survivor_failed = watch_engine(
      survivor_url,
      [](const nlohmann::json& j) {
        return !j.value("in_session", true) || group_of(j).value("aborted", false);
      },
      4 * engine_deadline);
  ASSERT_EQ(pending.wait_for(4 * tc.data_timeout), std::future_status::ready)
      << "the trainer did not return within 4x its deadline";
  const auto report = pending.get();
  const double trainer_ms = ms_between(t0, Clock::now());
  const auto survivor_at = survivor_failed.get();
  ASSERT_TRUE(survivor_at.has_value()) << "the surviving engine never left the session";
  const double survivor_ms = ms_between(t0, *survivor_at);
  const auto survivor_info = http_get(survivor_url, "/server_info");
  const std::string reason = group_of(survivor_info.body).value("abort_reason", "");

  // The trainer: a failed report naming the victim, typed by how the victim's calls failed.
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failed_engine, victim_url) << report_text(report);
  bool victim_unreachable = false;
  bool victim_timed_out = false;
  for (const auto& f : report.failures) {
    if (f.engine != victim_url) continue;
    victim_unreachable = victim_unreachable || f.unreachable;
    victim_timed_out = victim_timed_out || f.timed_out;
  }
  if (p.fault == Fault::kKill) {
    EXPECT_TRUE(victim_unreachable) << report_text(report);
  } else {
    EXPECT_TRUE(victim_timed_out) << report_text(report);
  }
  expect_within(p.fault, trainer_ms, tc.data_timeout, "trainer");

  // The survivor: its own data-plane error (or, after a crash, the trainer's abort).
  const std::string type = failure_type(reason);
  if (p.fault == Fault::kStop) {
    EXPECT_EQ(type, "timeout") << reason;
  } else {
    EXPECT_NE(type, "timeout") << reason;
  }
  expect_within(p.fault, survivor_ms, engine_deadline, "surviving engine");
  std::ostringstream fig;
  fig.precision(3);
  fig << "case=" << (p.fault == Fault::kKill ? 1 : 2) << " fault=" << fault_name
      << " victim=" << (p.victim == 0 ? "chain_middle" : "chain_end")
      << " trainer_error_ms=" << trainer_ms << " trainer_deadline_ms=" << tc.data_timeout.count()
      << " trainer_ratio=" << trainer_ms / static_cast<double>(tc.data_timeout.count())
      << " engine_error_ms=" << survivor_ms << " engine_deadline_ms=" << engine_deadline.count()
      << " engine_ratio=" << survivor_ms / static_cast<double>(engine_deadline.count())
      << " engine_error=" << type;
  figure(fig.str());

  // The survivor kept version 1, bit for bit, and serves again (the trainer resumed it).
  expect_engine_at(survivor_url, 1, "survivor");
  const EngineState s = engine_state(survivor_url);
  EXPECT_FALSE(s.in_session);
  EXPECT_FALSE(s.paused);

  if (p.fault == Fault::kStop) {
    // Alive again: the session must be gone, its staging dropped, generation not left paused.
    const auto t_cont = Clock::now();
    victim.signal(SIGCONT);
    const Millis bound = 2 * victim.config().session_timeout;
    const bool clean = wait_engine(
        victim_url,
        [](const nlohmann::json& j) {
          return !j.value("in_session", true) && !j.value("paused", true);
        },
        bound);
    const double clean_ms = ms_between(t_cont, Clock::now());
    EXPECT_TRUE(clean) << "after SIGCONT the engine stayed in its session or paused for "
                       << bound.count() << " ms: " << http_get(victim_url, "/health").body.dump();
    figure(
        "case=2 fault=SIGCONT victim=" + std::string(p.victim == 0 ? "chain_middle" : "chain_end") +
        " clean_state_ms=" + std::to_string(static_cast<long>(clean_ms)) +
        " bound_ms=" + std::to_string(bound.count()));
    expect_engine_at(victim_url, 1, "resumed victim");
    // The same updater recovers: it sees its group broken and forms a new one.
    const auto again = updater->update(views_at(2));
    ASSERT_TRUE(again.ok) << sync::trainer::summary(again);
  } else {
    // A crashed engine comes back as a new process (a new port); a new updater includes it.
    updater.reset();
    engines[p.victim] = std::make_unique<EnginePeer>(configs[p.victim]);
    expect_engine_at(engines[p.victim]->url(), 0, "restarted engine");
    auto fresh = make_updater(urls(), tc);
    const auto again = fresh->update(views_at(2));
    ASSERT_TRUE(again.ok) << sync::trainer::summary(again);
    EXPECT_EQ(again.version, "2");
  }
  for (const auto& e : engines) expect_engine_at(e->url(), 2, "after the recovery update");
}

INSTANTIATE_TEST_SUITE_P(Faults, EngineFault,
                         ::testing::Values(Param{Fault::kKill, 0}, Param{Fault::kKill, 1},
                                           Param{Fault::kStop, 0}, Param{Fault::kStop, 1}),
                         [](const ::testing::TestParamInfo<Param>& param) {
                           return name_of(param.param);
                         });

}  // namespace
}  // namespace weightcast::faults

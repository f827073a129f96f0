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

// What the survivors saw of the fault, timed from the signal.
struct FaultOutcome {
  sync::trainer::UpdateReport report;
  double trainer_ms = 0;
  double survivor_ms = 0;
  std::string reason;  // the survivor's abort_reason
};

class EngineFault : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    p_ = GetParam();
    survivor_ = 1 - p_.victim;
    configs_[1].ranks = 2;
    tc_.bucket_delay = 80ms;
    if (p_.fault == Fault::kKill) {
      // "Without waiting for a deadline" is told apart from waiting for it, under load, only
      // against a long deadline; a passing run does not wait for it.
      for (auto& c : configs_) c.comm_timeout = testing::kFastFailureDeadline;
      tc_.data_timeout = testing::kFastFailureDeadline;
    }
    for (const auto& c : configs_) engines_.push_back(std::make_unique<EnginePeer>(c));
  }

  std::vector<std::string> urls() const { return {engines_[0]->url(), engines_[1]->url()}; }
  Millis engine_deadline() const { return configs_[survivor_].comm_timeout; }
  std::string victim_name() const { return p_.victim == 0 ? "chain_middle" : "chain_end"; }

  // Starts version 2, signals the victim at its fourth bucket, and waits for the trainer and the
  // survivor to fail.
  void interrupt_update(FaultOutcome& out) {
    EnginePeer& victim = *engines_[p_.victim];
    const std::string survivor_url = engines_[survivor_]->url();
    const auto before = http_get(victim.url(), "/server_info");
    ASSERT_EQ(before.status, 200);
    const std::uint64_t base = buckets_received(before.body, kGroup);

    auto pending = std::async(std::launch::async, [&] { return updater_->update(views_at(2)); });
    ASSERT_TRUE(wait_engine(
        victim.url(),
        [&](const nlohmann::json& j) { return buckets_received(j, kGroup) >= base + 3; }, 20s))
        << "the update never reached its fourth bucket";
    const auto t0 = Clock::now();
    victim.signal(p_.fault == Fault::kKill ? SIGKILL : SIGSTOP);

    auto survivor_failed = watch_engine(
        survivor_url,
        [](const nlohmann::json& j) {
          return !j.value("in_session", true) || group_of(j).value("aborted", false);
        },
        4 * engine_deadline());
    ASSERT_EQ(pending.wait_for(4 * tc_.data_timeout), std::future_status::ready)
        << "the trainer did not return within 4x its deadline";
    out.report = pending.get();
    out.trainer_ms = ms_between(t0, Clock::now());
    const auto survivor_at = survivor_failed.get();
    ASSERT_TRUE(survivor_at.has_value()) << "the surviving engine never left the session";
    out.survivor_ms = ms_between(t0, *survivor_at);
    out.reason = group_of(http_get(survivor_url, "/server_info").body).value("abort_reason", "");
  }

  // The trainer: a failed report naming the victim, typed by how the victim's calls failed.
  void check_trainer(const FaultOutcome& out) const {
    const std::string victim_url = engines_[p_.victim]->url();
    const auto& report = out.report;
    EXPECT_FALSE(report.ok);
    EXPECT_EQ(report.failed_engine, victim_url) << report_text(report);
    bool victim_unreachable = false;
    bool victim_timed_out = false;
    for (const auto& f : report.failures) {
      if (f.engine != victim_url) continue;
      victim_unreachable = victim_unreachable || f.unreachable;
      victim_timed_out = victim_timed_out || f.timed_out;
    }
    if (p_.fault == Fault::kKill) {
      EXPECT_TRUE(victim_unreachable) << report_text(report);
    } else {
      EXPECT_TRUE(victim_timed_out) << report_text(report);
    }
    expect_within(p_.fault, out.trainer_ms, tc_.data_timeout, "trainer");
  }

  // The survivor: its own data-plane error (or, after a crash, the trainer's abort); it kept
  // version 1, bit for bit, and serves again (the trainer resumed it).
  void check_survivor(const FaultOutcome& out) const {
    const std::string type = failure_type(out.reason);
    if (p_.fault == Fault::kStop) {
      EXPECT_EQ(type, "timeout") << out.reason;
    } else {
      EXPECT_NE(type, "timeout") << out.reason;
    }
    expect_within(p_.fault, out.survivor_ms, engine_deadline(), "surviving engine");
    const double trainer_deadline = static_cast<double>(tc_.data_timeout.count());
    const double engine_deadline_ms = static_cast<double>(engine_deadline().count());
    std::ostringstream fig;
    fig.precision(3);
    fig << "case=" << (p_.fault == Fault::kKill ? 1 : 2)
        << " fault=" << (p_.fault == Fault::kKill ? "SIGKILL" : "SIGSTOP")
        << " victim=" << victim_name() << " trainer_error_ms=" << out.trainer_ms
        << " trainer_deadline_ms=" << tc_.data_timeout.count()
        << " trainer_ratio=" << out.trainer_ms / trainer_deadline
        << " engine_error_ms=" << out.survivor_ms
        << " engine_deadline_ms=" << engine_deadline().count()
        << " engine_ratio=" << out.survivor_ms / engine_deadline_ms << " engine_error=" << type;
    figure(fig.str());

    const std::string survivor_url = engines_[survivor_]->url();
    expect_engine_at(survivor_url, 1, "survivor");
    const EngineState s = engine_state(survivor_url);
    EXPECT_FALSE(s.in_session);
    EXPECT_FALSE(s.paused);
  }

  // A stopped victim, alive again: the session must be gone, its staging dropped, generation not
  // left paused; the same updater recovers (it sees its group broken and forms a new one).
  void recover_stopped() {
    EnginePeer& victim = *engines_[p_.victim];
    const auto t_cont = Clock::now();
    victim.signal(SIGCONT);
    const Millis bound = 2 * victim.config().session_timeout;
    const bool clean = wait_engine(
        victim.url(),
        [](const nlohmann::json& j) {
          return !j.value("in_session", true) && !j.value("paused", true);
        },
        bound);
    const double clean_ms = ms_between(t_cont, Clock::now());
    EXPECT_TRUE(clean) << "after SIGCONT the engine stayed in its session or paused for "
                       << bound.count() << " ms: " << http_get(victim.url(), "/health").body.dump();
    figure("case=2 fault=SIGCONT victim=" + victim_name() +
           " clean_state_ms=" + std::to_string(static_cast<long>(clean_ms)) +
           " bound_ms=" + std::to_string(bound.count()));
    expect_engine_at(victim.url(), 1, "resumed victim");
    const auto again = updater_->update(views_at(2));
    ASSERT_TRUE(again.ok) << sync::trainer::summary(again);
  }

  // A crashed engine comes back as a new process (a new port); a new updater includes it.
  void recover_killed() {
    updater_.reset();
    engines_[p_.victim] = std::make_unique<EnginePeer>(configs_[p_.victim]);
    expect_engine_at(engines_[p_.victim]->url(), 0, "restarted engine");
    auto fresh = make_updater(urls(), tc_);
    const auto again = fresh->update(views_at(2));
    ASSERT_TRUE(again.ok) << sync::trainer::summary(again);
    EXPECT_EQ(again.version, "2");
  }

  Param p_{};
  std::size_t survivor_ = 0;
  std::vector<EngineConfig> configs_ = std::vector<EngineConfig>(2);
  TrainerConfig tc_;
  std::vector<std::unique_ptr<EnginePeer>> engines_;
  std::unique_ptr<sync::trainer::DistributedUpdater> updater_;
};

TEST_P(EngineFault, SurvivorsFailTypedInBoundedTimeKeepTheirWeightsAndANewUpdateRestoresAll) {
  updater_ = make_updater(urls(), tc_);
  const auto first = updater_->update(views_at(1));
  ASSERT_TRUE(first.ok) << sync::trainer::summary(first);
  for (const auto& e : engines_) expect_engine_at(e->url(), 1, "after the first update");

  FaultOutcome out;
  interrupt_update(out);
  if (HasFatalFailure()) return;
  check_trainer(out);
  check_survivor(out);
  if (p_.fault == Fault::kStop) {
    recover_stopped();
  } else {
    recover_killed();
  }
  if (HasFatalFailure()) return;
  for (const auto& e : engines_) expect_engine_at(e->url(), 2, "after the recovery update");
}

INSTANTIATE_TEST_SUITE_P(Faults, EngineFault,
                         ::testing::Values(Param{Fault::kKill, 0}, Param{Fault::kKill, 1},
                                           Param{Fault::kStop, 0}, Param{Fault::kStop, 1}),
                         [](const ::testing::TestParamInfo<Param>& param) {
                           return name_of(param.param);
                         });

}  // namespace
}  // namespace weightcast::faults

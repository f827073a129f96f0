// Case 7 of the fault list: a soak of init -> update -> destroy cycles with a fault every tenth
// cycle, measuring the engine that survives everything: its open fds (/proc/PID/fd), threads
// (/proc/PID/status Threads) and RSS must stay flat. The faults rotate through: the other engine
// SIGKILLed mid-bucket (and restarted), the trainer failing mid-data (its communicator aborted,
// as when it crashes), the other engine SIGSTOPped mid-bucket (then SIGCONTed), and a rendezvous
// that cannot form (the other engine told a wrong world size).
//
// Cycles: WEIGHTCAST_SOAK_CYCLES (default 100, about 40 s here; at least 20). Longer soaks, e.g.
//   WEIGHTCAST_SOAK_CYCLES=2000 ctest --test-dir build -R Soak --timeout 3600
// Start figures are taken after a warm-up of cycles/4 cycles (at least 10), end figures after
// the last cycle.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/faults/fault_support.h"
#include "tests/faults/faulty_engine.h"

namespace weightcast::faults {
namespace {

using namespace std::chrono_literals;

int soak_cycles() {
  const char* env = std::getenv("WEIGHTCAST_SOAK_CYCLES");
  if (env == nullptr || *env == '\0') return 100;
  return std::max(20, std::atoi(env));
}

// Tolerances of "flat": a few fds or threads may be mid-teardown when sampled; RSS may move by
// allocator noise, but a leak of one model copy (3.3 MiB) per faulty cycle or of one bucket per
// cycle (75 cycles of 256 KiB after the warm-up of a 100-cycle soak) would exceed it; cycle to
// cycle the engine's RSS moves by up to ~10 MiB (glibc arenas of threads that come and go).
constexpr int kFdSlack = 2;
constexpr int kThreadSlack = 2;
constexpr long kRssSlackKib = 16 * 1024;
constexpr int kWindow = 10;

enum class Fault { kNone, kKillPeer, kTrainerFails, kStopPeer, kBadRendezvous };

Fault fault_of(int cycle) {
  if (cycle % 10 != 0) return Fault::kNone;
  switch ((cycle / 10) % 4) {
    case 1:
      return Fault::kKillPeer;
    case 2:
      return Fault::kTrainerFails;
    case 3:
      return Fault::kStopPeer;
    default:
      return Fault::kBadRendezvous;
  }
}

// Samples `pid` once its fd and thread counts have settled at or below `limit` (a teardown may
// still be finishing when a cycle returns), or after a short wait.
ProcStats settled(pid_t pid, const ProcStats& limit) {
  ProcStats s = proc_stats(pid);
  for (int i = 0; i < 50 && (s.fds > limit.fds || s.threads > limit.threads); ++i) {
    std::this_thread::sleep_for(20ms);
    s = proc_stats(pid);
  }
  return s;
}

// Arms this cycle's fault on the trainer's clients (`f[0]` the measured engine, `f[1]` the
// peer): the signal lands while the peer holds the request of its fourth bucket.
void arm_fault(Fault fault, const std::vector<FaultyEngine*>& f, pid_t peer_pid,
               std::atomic<int>& bucket_calls) {
  if (fault == Fault::kKillPeer || fault == Fault::kStopPeer) {
    const int sig = fault == Fault::kKillPeer ? SIGKILL : SIGSTOP;
    f[1]->before = [&bucket_calls, sig, peer_pid](const std::string& route) {
      if (route == "POST /update_weights_from_distributed" && ++bucket_calls == 4) {
        ::kill(peer_pid, sig);
      }
    };
  } else if (fault == Fault::kTrainerFails) {
    f[0]->before = [&bucket_calls](const std::string& route) {
      if (route == "POST /update_weights_from_distributed" && ++bucket_calls == 4) {
        throw comm::PeerError("trainer", "injected: the trainer fails mid-data");
      }
    };
  } else if (fault == Fault::kBadRendezvous) {
    f[1]->rewrite_init = [](sync::InitWeightsUpdateGroupRequest& r) { r.world_size += 1; };
  }
}

// One past the highest version the connected engines report.
std::uint64_t next_version(sync::trainer::DistributedUpdater& updater) {
  std::uint64_t next = 1;
  for (const auto& info : updater.connect()) {
    const auto& v = info.weight_version;
    if (v != "default") next = std::max<std::uint64_t>(next, std::stoull(v) + 1);
  }
  return next;
}

// Brings the peer back after the cycle's fault: a killed peer restarts, a stopped one continues
// and must come back out of its session and unpaused.
void recover_peer(Fault fault, std::unique_ptr<EnginePeer>& peer, const EngineConfig& config) {
  if (fault == Fault::kKillPeer) {
    peer = std::make_unique<EnginePeer>(config);
  } else if (fault == Fault::kStopPeer) {
    peer->signal(SIGCONT);
    ASSERT_TRUE(wait_engine(
        peer->url(),
        [](const nlohmann::json& j) {
          return !j.value("in_session", true) && !j.value("paused", true);
        },
        4 * config.session_timeout))
        << "the stopped peer never came back clean";
  }
}

// What the soak measures of the engine that survives everything, cycle by cycle.
struct SoakFigures {
  int cycles = 0;
  int warmup = 0;
  ProcStats early, start, high{-1, -1, -1};
  std::vector<long> rss;  // per cycle, KiB
  int faults = 0, committed = 0;

  void record(int cycle, const ProcStats& s) {
    if (cycle == 2) early = s;
    // The allocator's arenas grow over the first cycles (threads come and go with every group)
    // and then hold steady; "flat" is measured from there.
    if (cycle == warmup) start = s;
    high.fds = std::max(high.fds, s.fds);
    high.threads = std::max(high.threads, s.threads);
    high.rss_kib = std::max(high.rss_kib, s.rss_kib);
    rss.push_back(s.rss_kib);
  }
  // The limit a settled sample must reach: none during the warm-up, the start's figures after.
  ProcStats limit(pid_t pid, int cycle) const {
    return cycle <= warmup ? proc_stats(pid)
                           : ProcStats{start.fds + kFdSlack, start.threads + kThreadSlack, 0};
  }
  // Prints the figures and checks that fds, threads and RSS stayed flat.
  void check_flat(const ProcStats& end, double seconds) const {
    std::ostringstream fig;
    fig << "case=7 cycles=" << cycles << " committed=" << committed << " faults=" << faults
        << " seconds=" << seconds << " warmup_cycles=" << warmup << " fds_cycle2=" << early.fds
        << " threads_cycle2=" << early.threads << " rss_kib_cycle2=" << early.rss_kib
        << " fds_start=" << start.fds << " fds_end=" << end.fds << " fds_max=" << high.fds
        << " threads_start=" << start.threads << " threads_end=" << end.threads
        << " threads_max=" << high.threads << " rss_kib_start=" << start.rss_kib
        << " rss_kib_end=" << end.rss_kib << " rss_kib_max=" << high.rss_kib;
    figure(fig.str());
    EXPECT_LE(end.fds, start.fds + kFdSlack);
    EXPECT_LE(end.threads, start.threads + kThreadSlack);
    // RSS swings by several MiB from cycle to cycle, so high-water marks are compared: the last
    // kWindow cycles against the kWindow cycles that end the warm-up.
    auto window_max = [&](int last_cycle) {
      return *std::max_element(rss.begin() + (last_cycle - kWindow), rss.begin() + last_cycle);
    };
    const long rss_start_window = window_max(warmup);
    const long rss_end_window = window_max(cycles);
    figure("case=7 rss_kib_window_start_max=" + std::to_string(rss_start_window) +
           " rss_kib_window_end_max=" + std::to_string(rss_end_window) +
           " window_cycles=" + std::to_string(kWindow));
    EXPECT_LE(rss_end_window, rss_start_window + kRssSlackKib);
    EXPECT_LE(end.rss_kib, rss_start_window + kRssSlackKib);
    EXPECT_EQ(faults, cycles / 10);
  }
};

// The soak's engines and trainer settings.
struct SoakSetup {
  // Timeouts: a cycle without a fault must not fail because the machine stalled for a second
  // (the suite runs under ctest -j2 on two cores), so its waits are generous; a fault cycle's
  // trainer gives up on a silent engine sooner, since that wait is what the cycle costs. The
  // engines' init timeout stays under the trainer's group timeout, so that the engine fails a
  // rendezvous that cannot form (the wrong world size) before its trainer does.
  static EngineConfig engine_config() {
    EngineConfig config;
    config.comm_timeout = config.session_timeout = 4000ms;
    config.init_timeout = 2500ms;
    return config;
  }
  static TrainerConfig trainer_config() {
    TrainerConfig tc;
    tc.data_timeout = tc.group_timeout = 8000ms;
    tc.request_timeout = 4000ms;
    tc.failure_grace = 300ms;
    return tc;
  }
  static TrainerConfig fault_config(const EngineConfig& config) {
    TrainerConfig fault_tc = trainer_config();
    fault_tc.data_timeout = 3000ms;
    fault_tc.group_timeout = config.init_timeout + 1000ms;
    fault_tc.request_timeout = 800ms;
    return fault_tc;
  }

  EngineConfig config = engine_config();
  EnginePeer measured{config};
  std::unique_ptr<EnginePeer> peer = std::make_unique<EnginePeer>(config);
  TrainerConfig tc = trainer_config();
  TrainerConfig fault_tc = fault_config(config);
};

// One init -> update -> destroy cycle with `fault` armed; counts it in `fig`.
void run_cycle(SoakSetup& s, Fault fault, SoakFigures& fig) {
  std::vector<std::string> urls = {s.measured.url(), s.peer->url()};
  const auto options = updater_options(fault == Fault::kNone ? s.tc : s.fault_tc);
  auto [f, apis] = faulty_clients(urls, options);
  std::atomic<int> bucket_calls{0};
  arm_fault(fault, f, s.peer->pid(), bucket_calls);
  {
    sync::trainer::DistributedUpdater updater(std::move(apis), options);
    const std::uint64_t next = next_version(updater);
    const auto report = updater.update(views_at(next));
    if (fault == Fault::kNone) {
      ASSERT_TRUE(report.ok) << report_text(report);
      ++fig.committed;
    } else {
      EXPECT_FALSE(report.ok) << "the injected fault did not fail the update";
      ++fig.faults;
    }
  }  // destroy: the updater leaves its group on both engines
  recover_peer(fault, s.peer, s.config);
}

TEST(Soak, InitUpdateDestroyCyclesWithFaultsKeepTheEngineFlat) {
  SoakSetup s;
  SoakFigures fig;
  fig.cycles = soak_cycles();
  fig.warmup = std::max(kWindow, fig.cycles / 4);
  const auto t_start = Clock::now();
  for (int cycle = 1; cycle <= fig.cycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    run_cycle(s, fault_of(cycle), fig);
    if (::testing::Test::HasFatalFailure()) return;
    const auto h = http_get(s.measured.url(), "/health").body;
    EXPECT_FALSE(h.value("in_session", true)) << h.dump();
    EXPECT_FALSE(h.value("paused", true)) << h.dump();
    fig.record(cycle, settled(s.measured.pid(), fig.limit(s.measured.pid(), cycle)));
  }
  const double seconds = ms_between(t_start, Clock::now()) / 1000;
  fig.check_flat(settled(s.measured.pid(), fig.limit(s.measured.pid(), fig.cycles + 1)), seconds);
  // The survivor still takes a normal update and holds exactly what was sent.
  auto updater = make_updater({s.measured.url(), s.peer->url()}, s.tc);
  const std::uint64_t next = next_version(*updater);
  const auto report = updater->update(views_at(next));
  ASSERT_TRUE(report.ok) << report_text(report);
  expect_engine_at(s.measured.url(), next, "the soaked engine");
}

}  // namespace
}  // namespace weightcast::faults

// Case 4 of the fault list: a group that can never form. Every side must fail with a typed error
// in bounded time, release the ports it opened for the rendezvous (the trainer's store, every
// Gloo listener), keep its fd and thread counts, and the engine must keep answering /health and
// take a normal update afterwards.
//   RankMissing:       engine B is SIGSTOPped before init; A and the trainer wait for B's rank.
//   UnreachableStore:  the engine is told a store port where nothing accepts (a socket bound but
//                      not listening, held by the test so nobody else takes the port).
//   WrongWorldSize:    the engine is told world_size 3 while the group has 2 members.
//   ChunkSizeMismatch: the engine cuts chain chunks of 64 KiB, the trainer of 4 MiB.
// Only a deadline can end the first two: each side must fail in [0.5x, 2x] of its own (engine:
// --init-timeout-ms, answered 504; trainer: its group timeout). The last two are visible in what
// the members exchange, so they must fail before half a deadline, without waiting for one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "sync/trainer/engine_calls.h"
#include "tests/faults/fault_support.h"
#include "tests/faults/faulty_engine.h"
#include "tests/support/time_bounds.h"

namespace weightcast::faults {
namespace {

using namespace std::chrono_literals;

// A TCP port on 127.0.0.1 that refuses connections for as long as this object lives.
class RefusingPort {
 public:
  RefusingPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("cannot bind a refusing port");
    }
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// Waits until `pid` listens on exactly `ports` and has at most the fds and threads of `base`;
// returns the milliseconds it took, or -1 when `limit` passed first.
long wait_released(pid_t pid, const std::set<int>& ports, const ProcStats& base, Millis limit) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    const ProcStats s = proc_stats(pid);
    if (listening_ports(pid) == ports && s.fds <= base.fds && s.threads <= base.threads) {
      return static_cast<long>(ms_between(start, Clock::now()));
    }
    std::this_thread::sleep_for(10ms);
  }
  const ProcStats s = proc_stats(pid);
  ADD_FAILURE() << "pid " << pid << " listens on " << listening_ports(pid).size()
                << " port(s), has " << s.fds << " fds (before: " << base.fds << ") and "
                << s.threads << " threads (before: " << base.threads << ")";
  return -1;
}

CallRecord init_call(const FaultyEngine& e) {
  for (const auto& c : e.calls()) {
    if (c.route == "POST /init_weights_update_group") return c;
  }
  ADD_FAILURE() << "no init call was made";
  return {};
}

void expect_bounded(bool by_deadline, double ms, Millis deadline, const std::string& who) {
  const double d = static_cast<double>(deadline.count());
  if (by_deadline) {
    EXPECT_GE(ms, 0.5 * d) << who << " failed before half its deadline";
    EXPECT_LE(ms, testing::late_bound_ms(d)) << who << " failed long after its deadline";
  } else {
    EXPECT_LT(ms, 0.5 * d) << who << " waited for a deadline on a visible mismatch";
    EXPECT_GE(d, static_cast<double>(testing::kFastFailureDeadline.count())) << "too short to tell";
  }
}

struct Kind {
  const char* name;
  bool by_deadline;
  const char* engine_error;  // how engine A's init must fail
};
const Kind kRankMissing{"RankMissing", true, "EngineError 504"};
const Kind kUnreachableStore{"UnreachableStore", true, "EngineError 504"};
const Kind kWrongWorldSize{"WrongWorldSize", false, "EngineError 500"};
const Kind kChunkSizeMismatch{"ChunkSizeMismatch", false, "EngineError 400"};

void PrintTo(const Kind& k, std::ostream* os) {
  *os << k.name;
}

bool is(const Kind& a, const Kind& b) {
  return std::string(a.name) == b.name;
}

// Rewrites the first engine's init for the kinds that fault it there.
void arm_init_fault(const Kind& kind, FaultyEngine& engine, RefusingPort& refusing) {
  if (is(kind, kWrongWorldSize)) {
    engine.rewrite_init = [](sync::InitWeightsUpdateGroupRequest& r) { r.world_size += 1; };
  } else if (is(kind, kUnreachableStore)) {
    engine.rewrite_init = [&refusing](sync::InitWeightsUpdateGroupRequest& r) {
      r.master_port = refusing.port();
    };
  }
}

// Forms stage 0's group and returns the type of error the trainer got ("none": it formed).
std::string group_error_type(sync::trainer::DistributedUpdater& updater) {
  try {
    updater.ensure_group(0);
  } catch (const sync::trainer::EngineCallError&) {
    return "EngineCallError";  // a PeerError naming the engine
  } catch (const comm::TimeoutError&) {
    return "TimeoutError";
  } catch (const comm::PeerError&) {
    return "PeerError";
  }
  return "none";
}

// How the trainer failed and against which deadline.
struct TrainerFailure {
  std::string type;
  double ms = 0;
  Millis deadline{0};
};

// The case's figure line: who failed how, when, and when the ports were released.
std::string figure_line(const Kind& kind, const TrainerFailure& trainer, const CallRecord& init,
                        double engine_ms, Millis engine_deadline, long engine_release_ms,
                        long missing_release_ms) {
  std::ostringstream fig;
  fig.precision(3);
  fig << "case=4 kind=" << kind.name << " trainer_error=" << trainer.type
      << " trainer_error_ms=" << static_cast<long>(trainer.ms)
      << " trainer_deadline_ms=" << trainer.deadline.count()
      << " trainer_ratio=" << trainer.ms / static_cast<double>(trainer.deadline.count())
      << " engine_error=\"" << init.error_type
      << "\" engine_error_ms=" << static_cast<long>(engine_ms)
      << " engine_deadline_ms=" << engine_deadline.count()
      << " engine_ratio=" << engine_ms / static_cast<double>(engine_deadline.count())
      << " engine_ports_released_ms=" << engine_release_ms;
  if (is(kind, kRankMissing)) fig << " stopped_engine_released_ms=" << missing_release_ms;
  return fig.str();
}

// Nothing stuck: a correct group and update go through (for the mismatch, a trainer that cuts
// the engine's chunk size).
void expect_recovery(const Kind& kind, const std::vector<std::string>& urls,
                     sync::trainer::UpdaterOptions options) {
  if (is(kind, kChunkSizeMismatch)) {
    options.communicator_factory = [](std::string_view backend, const comm::CommOptions& o) {
      comm::CommOptions same = o;
      same.gloo.chain.chunk_bytes = 64 << 10;
      return comm::create_communicator(backend, same);
    };
  }
  sync::trainer::DistributedUpdater healthy(urls, options);
  const auto report = healthy.update(views_at(1));
  ASSERT_TRUE(report.ok) << report_text(report);
  for (const auto& url : urls) expect_engine_at(url, 1, "after the failed rendezvous");
}

class RendezvousFault : public ::testing::TestWithParam<Kind> {};

TEST_P(RendezvousFault, EverySideFailsTypedInBoundedTimeReleasesPortsAndTheEngineRecovers) {
  const Kind kind = GetParam();
  const std::size_t n = is(kind, kRankMissing) ? 2 : 1;
  EngineConfig config;  // --init-timeout-ms 3000
  // "Without waiting for a deadline" is told apart from waiting for it, under load, only against
  // a long deadline; a passing run does not wait for it.
  if (!kind.by_deadline) config.init_timeout = testing::kFastFailureDeadline;
  if (is(kind, kChunkSizeMismatch)) config.extra = {"--chunk-bytes", "64K"};
  std::vector<std::unique_ptr<EnginePeer>> engines;
  std::vector<std::string> urls;
  std::vector<ProcStats> base;
  for (std::size_t i = 0; i < n; ++i) {
    engines.push_back(std::make_unique<EnginePeer>(config));
    urls.push_back(engines.back()->url());
    ASSERT_EQ(http_get(urls.back(), "/health").status, 200);
    base.push_back(steady_stats(engines.back()->pid()));
  }
  const std::set<int> trainer_ports = listening_ports(::getpid());

  TrainerConfig tc;
  tc.group_timeout = config.init_timeout + 1000ms;  // above the engines', so their answer arrives
  tc.data_timeout = tc.group_timeout;
  auto options = updater_options(tc);
  RefusingPort refusing;
  auto [faulty, apis] = faulty_clients(urls, options);
  arm_init_fault(kind, *faulty[0], refusing);
  auto updater = std::make_unique<sync::trainer::DistributedUpdater>(std::move(apis), options);
  updater->connect();
  if (is(kind, kRankMissing)) engines[1]->signal(SIGSTOP);

  const auto t0 = Clock::now();
  const std::string trainer_type = group_error_type(*updater);
  const double trainer_ms = ms_between(t0, Clock::now());
  EXPECT_NE(trainer_type, "none") << "the group formed";
  expect_bounded(kind.by_deadline, trainer_ms, tc.group_timeout, "trainer");

  const CallRecord init = init_call(*faulty[0]);
  EXPECT_EQ(init.error_type, kind.engine_error) << init.error;
  const double engine_ms = ms_between(init.start, init.end);
  expect_bounded(kind.by_deadline, engine_ms, config.init_timeout, "engine");
  if (is(kind, kChunkSizeMismatch)) {
    EXPECT_NE(init.error.find("chunk_bytes 4194304"), std::string::npos) << init.error;
  }

  // Ports: the trainer's store and Gloo listener are closed once it has thrown; the engine's
  // Gloo listeners once it has answered.
  EXPECT_EQ(listening_ports(::getpid()), trainer_ports) << "the trainer kept a rendezvous port";
  const long engine_release_ms =
      wait_released(engines[0]->pid(), {engines[0]->port()}, base[0], 2000ms);
  EXPECT_EQ(http_get(urls[0], "/health").status, 200);

  long missing_release_ms = 0;
  if (is(kind, kRankMissing)) {
    const CallRecord b_init = init_call(*faulty[1]);
    EXPECT_EQ(b_init.error_type, "TimeoutError") << b_init.error;
    // Awake again, B serves the stale init against a store that is gone: it must answer /health
    // meanwhile, and end with nothing left of that join.
    engines[1]->signal(SIGCONT);
    EXPECT_EQ(http_get(urls[1], "/health", 1000ms).status, 200);
    missing_release_ms = wait_released(engines[1]->pid(), {engines[1]->port()}, base[1],
                                       2 * config.init_timeout + 2000ms);
  }
  figure(figure_line(kind, {trainer_type, trainer_ms, tc.group_timeout}, init, engine_ms,
                     config.init_timeout, engine_release_ms, missing_release_ms));

  updater.reset();
  expect_recovery(kind, urls, options);
}

INSTANTIATE_TEST_SUITE_P(Faults, RendezvousFault,
                         ::testing::Values(kRankMissing, kUnreachableStore, kWrongWorldSize,
                                           kChunkSizeMismatch),
                         [](const ::testing::TestParamInfo<Kind>& param) {
                           return std::string(param.param.name);
                         });

}  // namespace
}  // namespace weightcast::faults

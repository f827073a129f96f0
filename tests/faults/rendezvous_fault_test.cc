// Case 4 of the fault list: a group that can never form. Every side must fail with a typed error
// in [0.5x, 2x] of its own deadline (the engine: --init-timeout-ms; the trainer: its group
// timeout), release the ports it opened for the rendezvous (the trainer's store, every Gloo
// listener), keep its fd and thread counts, and the engine must keep answering /health and take
// a normal update afterwards.
//   WrongWorldSize:   the engine is told world_size 3 while the group has 2 members.
//   RankMissing:      engine B is SIGSTOPped before init; engine A waits for B's rank.
//   UnreachableStore: the engine is told a store port where nothing accepts (a socket bound but
//                     not listening, held by the test so nobody else takes the port).
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
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      throw std::runtime_error("cannot bind a refusing port");
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// Waits until `pid` listens on exactly `ports` and has at most `fds` fds and `threads` threads;
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
  return -1;
}

const CallRecord* init_call(const FaultyEngine& e, std::vector<CallRecord>& storage) {
  storage = e.calls();
  for (const auto& c : storage) {
    if (c.route == "POST /init_weights_update_group") return &c;
  }
  return nullptr;
}

enum class Kind { kWrongWorldSize, kRankMissing, kUnreachableStore };

class RendezvousFault : public ::testing::TestWithParam<Kind> {};

TEST_P(RendezvousFault, EverySideFailsTypedInBoundedTimeReleasesPortsAndTheEngineRecovers) {
  const Kind kind = GetParam();
  const char* kind_name = kind == Kind::kWrongWorldSize ? "wrong_world_size"
                          : kind == Kind::kRankMissing  ? "rank_missing"
                                                        : "unreachable_store";
  const std::size_t n = kind == Kind::kRankMissing ? 2 : 1;
  EngineConfig config;  // --init-timeout-ms 3000
  std::vector<std::unique_ptr<EnginePeer>> engines;
  std::vector<std::string> urls;
  for (std::size_t i = 0; i < n; ++i) {
    engines.push_back(std::make_unique<EnginePeer>(config));
    urls.push_back(engines.back()->url());
  }
  std::vector<ProcStats> base;
  for (const auto& e : engines) base.push_back(proc_stats(e->pid()));
  const std::set<int> trainer_ports = listening_ports(::getpid());

  TrainerConfig tc;
  tc.group_timeout = 4000ms;  // above the engines' 3000 ms, so their answer can arrive
  tc.data_timeout = 4000ms;
  const auto options = updater_options(tc);
  RefusingPort refusing;
  std::vector<FaultyEngine*> faulty;
  std::vector<std::unique_ptr<sync::trainer::EngineApi>> apis;
  for (const auto& url : urls) {
    auto f = std::make_unique<FaultyEngine>(engine_client(url, options));
    faulty.push_back(f.get());
    apis.push_back(std::move(f));
  }
  if (kind == Kind::kWrongWorldSize) {
    faulty[0]->rewrite_init = [](sync::InitWeightsUpdateGroupRequest& r) { r.world_size += 1; };
  } else if (kind == Kind::kUnreachableStore) {
    faulty[0]->rewrite_init = [&](sync::InitWeightsUpdateGroupRequest& r) {
      r.master_port = refusing.port();
    };
  }
  auto updater = std::make_unique<sync::trainer::DistributedUpdater>(std::move(apis), options);
  updater->connect();
  if (kind == Kind::kRankMissing) engines[1]->signal(SIGSTOP);

  const auto t0 = Clock::now();
  std::string trainer_type = "none";
  try {
    updater->ensure_group(0);
  } catch (const sync::trainer::EngineCallError& e) {
    trainer_type = "EngineCallError(PeerError)";
  } catch (const comm::TimeoutError& e) {
    trainer_type = "TimeoutError";
  } catch (const comm::PeerError& e) {
    trainer_type = "PeerError";
  }
  const double trainer_ms = ms_between(t0, Clock::now());
  const double trainer_deadline = static_cast<double>(tc.group_timeout.count());
  EXPECT_NE(trainer_type, "none") << "the group formed?";
  EXPECT_GE(trainer_ms, 0.5 * trainer_deadline);
  EXPECT_LE(trainer_ms, 2.0 * trainer_deadline);

  // Engine A answered its init with 504 (its rendezvous timed out) within its own deadline.
  std::vector<CallRecord> calls;
  const CallRecord* init = init_call(*faulty[0], calls);
  ASSERT_NE(init, nullptr);
  EXPECT_FALSE(init->ok);
  EXPECT_EQ(init->error_type, "EngineError 504") << init->error;
  const double engine_ms = ms_between(init->start, init->end);
  const double engine_deadline = static_cast<double>(config.init_timeout.count());
  EXPECT_GE(engine_ms, 0.5 * engine_deadline);
  EXPECT_LE(engine_ms, 2.0 * engine_deadline);

  // Ports: the trainer's store and Gloo listener are closed once it has thrown; the engine's
  // Gloo listeners once it has answered.
  EXPECT_EQ(listening_ports(::getpid()), trainer_ports) << "the trainer kept a rendezvous port";
  const long engine_release_ms =
      wait_released(engines[0]->pid(), {engines[0]->port()}, base[0], 2000ms);
  EXPECT_GE(engine_release_ms, 0) << "engine A kept a port, an fd or a thread";
  EXPECT_EQ(http_get(urls[0], "/health").status, 200);

  long missing_release_ms = 0;
  if (kind == Kind::kRankMissing) {
    std::vector<CallRecord> b_calls;
    const CallRecord* b_init = init_call(*faulty[1], b_calls);
    ASSERT_NE(b_init, nullptr);
    EXPECT_EQ(b_init->error_type, "TimeoutError") << b_init->error;
    // Awake again, B serves the stale init against a store that is gone: it must still answer
    // /health meanwhile, and end with nothing left of that join.
    engines[1]->signal(SIGCONT);
    EXPECT_EQ(http_get(urls[1], "/health", 1000ms).status, 200);
    missing_release_ms = wait_released(engines[1]->pid(), {engines[1]->port()}, base[1],
                                       2 * config.init_timeout + 2000ms);
    EXPECT_GE(missing_release_ms, 0) << "engine B kept a port, an fd or a thread";
  }
  std::ostringstream fig;
  fig << "case=4 kind=" << kind_name << " trainer_error=" << trainer_type
      << " trainer_error_ms=" << static_cast<long>(trainer_ms)
      << " trainer_deadline_ms=" << tc.group_timeout.count()
      << " trainer_ratio=" << trainer_ms / trainer_deadline << " engine_error=" << init->error_type
      << " engine_error_ms=" << static_cast<long>(engine_ms)
      << " engine_deadline_ms=" << config.init_timeout.count()
      << " engine_ratio=" << engine_ms / engine_deadline
      << " engine_ports_released_ms=" << engine_release_ms;
  if (kind == Kind::kRankMissing) fig << " stopped_engine_released_ms=" << missing_release_ms;
  figure(fig.str());

  // Nothing stuck: a correct group and update go through.
  updater.reset();
  auto healthy = make_updater(urls, tc);
  const auto report = healthy->update(views_at(1));
  ASSERT_TRUE(report.ok) << sync::trainer::summary(report);
  for (const auto& url : urls) expect_engine_at(url, 1, "after the failed rendezvous");
}

INSTANTIATE_TEST_SUITE_P(Faults, RendezvousFault,
                         ::testing::Values(Kind::kWrongWorldSize, Kind::kRankMissing,
                                           Kind::kUnreachableStore),
                         [](const ::testing::TestParamInfo<Kind>& param) {
                           switch (param.param) {
                             case Kind::kWrongWorldSize:
                               return std::string("WrongWorldSize");
                             case Kind::kRankMissing:
                               return std::string("RankMissing");
                             default:
                               return std::string("UnreachableStore");
                           }
                         });

}  // namespace
}  // namespace weightcast::faults

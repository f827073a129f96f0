// Multi-process Gloo tests: real processes (gloo_worker) rendezvous through a TcpStoreServer that
// this test hosts on an ephemeral port. Every worker is a Subprocess, killed on scope exit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/tcp_store.h"
#include "tests/support/subprocess.h"
#include "tests/support/time_bounds.h"

#ifndef WORKER_PATH
#error "WORKER_PATH must name the gloo_worker executable"
#endif

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;
using testing::fast_bound;
using testing::kFastFailureDeadline;
using testing::kSchedulingAllowance;
using testing::late_bound;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;

// Whether this machine lets a process read a sibling's memory with process_vm_readv, as the
// workers of one group must for single copy: Yama's ptrace_scope 1 or more limits it to
// descendants, and a seccomp filter may refuse the call. The workers then agree on sockets.
bool siblings_may_read_each_other() {
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (yama >> scope && scope > 0) return false;
  static char token[8] = "sibling";
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  char got[8] = {};
  iovec local{got, sizeof(got)};
  iovec remote{token, sizeof(token)};
  const bool ok = ::process_vm_readv(child, &local, 1, &remote, 1, 0) == sizeof(got);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return ok && std::string(got) == "sibling";
}

struct WorkerArgs {
  int rank = 0;
  int size = 1;
  int root = 0;
  std::size_t bytes = 0;
  milliseconds timeout{10000};
  std::size_t chunk_bytes = 1u << 20;
  int chunks_in_flight = 4;
  std::size_t stop_at_bytes = 0;
  bool single_copy = true;
};

struct Outcome {
  std::optional<int> exit_code;  // nullopt: did not exit in time
  milliseconds after{0};         // from the reference point to the exit
  std::string last_line;
  std::string output;
};

class GlooProcessTest : public ::testing::Test {
 protected:
  Subprocess spawn(const std::string& prefix, const WorkerArgs& w) {
    std::vector<std::string> argv = {WORKER_PATH,
                                     "--store-host",
                                     server_.host(),
                                     "--store-port",
                                     std::to_string(server_.port()),
                                     "--prefix",
                                     prefix,
                                     "--rank",
                                     std::to_string(w.rank),
                                     "--size",
                                     std::to_string(w.size),
                                     "--root",
                                     std::to_string(w.root),
                                     "--bytes",
                                     std::to_string(w.bytes),
                                     "--timeout-ms",
                                     std::to_string(w.timeout.count()),
                                     "--chunk-bytes",
                                     std::to_string(w.chunk_bytes),
                                     "--chunks-in-flight",
                                     std::to_string(w.chunks_in_flight),
                                     "--single-copy",
                                     w.single_copy ? "1" : "0"};
    if (w.stop_at_bytes > 0) {
      argv.push_back("--stop-at-bytes");
      argv.push_back(std::to_string(w.stop_at_bytes));
    }
    return Subprocess(argv);
  }

  // Ranks 0..count-1 of `base` (each with its own rank), in rank order; `adjust`, when set, may
  // change a rank's arguments before it starts.
  std::vector<Subprocess> spawn_ranks(const std::string& prefix, int count, const WorkerArgs& base,
                                      const std::function<void(WorkerArgs&)>& adjust = {}) {
    std::vector<Subprocess> workers;
    for (int r = 0; r < count; ++r) {
      WorkerArgs w = base;
      w.rank = r;
      if (adjust) adjust(w);
      workers.push_back(spawn(prefix, w));
    }
    return workers;
  }

  // Waits (up to `limit` from `since`) for the worker to exit and collects what it printed.
  static Outcome finish(Subprocess& p, Clock::time_point since, milliseconds limit) {
    Outcome o;
    const auto left = std::chrono::duration_cast<milliseconds>(since + limit - Clock::now());
    o.output = p.drain(std::max(left, milliseconds(1)));
    o.exit_code =
        p.wait(milliseconds(std::max<long>(0, (since + limit - Clock::now()) / milliseconds(1))));
    o.after = std::chrono::duration_cast<milliseconds>(Clock::now() - since);
    const auto end = o.output.find_last_not_of('\n');
    if (end != std::string::npos) {
      const auto start = o.output.rfind('\n', end);
      o.last_line = o.output.substr(start == std::string::npos ? 0 : start + 1,
                                    end - (start == std::string::npos ? 0 : start + 1) + 1);
    }
    return o;
  }

  TcpStoreServer server_{TcpStoreServerOptions{}};
};

// Four processes, root 1, 8 MiB: every rank ends with the root's bytes, by single copy out of the
// root's memory (four processes of one host agree on it) and, with single copy off, down the
// chain in 256 KiB chunks.
TEST_F(GlooProcessTest, FourProcessesBroadcastEightMiB) {
  constexpr int kSize = 4;
  for (const bool single_copy : {true, false}) {
    auto workers = spawn_ranks(single_copy ? "bcast8-copy" : "bcast8-chain", kSize,
                               {.size = kSize,
                                .root = 1,
                                .bytes = 8u << 20,
                                .timeout = milliseconds(20000),
                                .chunk_bytes = 256u << 10,
                                .single_copy = single_copy});
    const auto start = Clock::now();
    const bool copies = single_copy && siblings_may_read_each_other();
    const std::string path = copies ? "path single-copy\n" : "path sockets\n";
    for (int r = 0; r < kSize; ++r) {
      auto o = finish(workers[static_cast<std::size_t>(r)], start, milliseconds(30000));
      EXPECT_EQ(o.exit_code, std::optional<int>(0)) << "rank " << r << " printed:\n" << o.output;
      EXPECT_EQ(o.last_line, "ok") << "rank " << r;
      EXPECT_NE(o.output.find(path), std::string::npos) << "rank " << r << ":\n" << o.output;
    }
  }
}

// Ranks 0..2 of 4 start; rank 3 never does. Each gives up with TimeoutError close to its 2 s
// deadline: not early (it waited), not late (it honoured the deadline; late_bound allows for a
// loaded machine).
TEST_F(GlooProcessTest, RankThatNeverJoinsGivesTimeoutErrorNearTheDeadline) {
  constexpr milliseconds kTimeout{2000};
  const auto start = Clock::now();
  auto workers = spawn_ranks("missing", 3, {.size = 4, .bytes = 1024, .timeout = kTimeout});
  for (int r = 0; r < 3; ++r) {
    auto o = finish(workers[static_cast<std::size_t>(r)], start, late_bound(kTimeout) * 2);
    EXPECT_EQ(o.exit_code, std::optional<int>(2)) << "rank " << r << " printed:\n" << o.output;
    EXPECT_EQ(o.last_line.rfind("error TimeoutError: ", 0), 0u) << o.last_line;
    EXPECT_GE(o.after, kTimeout / 2) << "rank " << r << " gave up early";
    EXPECT_LE(o.after, late_bound(kTimeout)) << "rank " << r << " overran its deadline";
  }
}

// Rank 2 of 4 (a middle link of the chain from root 0) freezes itself (SIGSTOP) once the first
// chunk of a 512 MiB broadcast has arrived, and is SIGKILLed there. Chunks are 8 MiB, larger than
// the socket buffers, so its neighbours are caught mid-chunk: rank 3 part-way through reading,
// rank 1 part-way through writing. Gloo does not fail those in-flight buffers when the
// connection drops; without the backend's watchdog both would sit until the deadline and report
// a timeout. Every survivor must end with a typed error within its deadline; the neighbours
// must say PeerError and name rank 2.
TEST_F(GlooProcessTest, ReceiverKilledMidBroadcastGivesTypedErrorsToSurvivors) {
  constexpr int kSize = 4;
  constexpr int kVictim = 2;
  constexpr std::size_t kBytes = 512u << 20;
  constexpr std::size_t kChunk = 8u << 20;
  // Long, so a loaded machine's slow start-up and transfer stay inside it; a survivor that ignored
  // a closed connection would still wait it out.
  constexpr milliseconds kTimeout = kFastFailureDeadline;
  auto workers = spawn_ranks("killed", kSize,
                             {.size = kSize,
                              .root = 0,
                              .bytes = kBytes,
                              .timeout = kTimeout,
                              .chunk_bytes = kChunk,
                              .single_copy = false},
                             [&](WorkerArgs& w) {
                               if (w.rank == kVictim) w.stop_at_bytes = kChunk;
                             });
  auto& victim = workers[kVictim];
  const auto stopping = victim.wait_for_line("stopping ", late_bound(kTimeout));
  ASSERT_TRUE(stopping.has_value()) << "victim never got mid-transfer:\n"
                                    << victim.drain(milliseconds(100));
  EXPECT_LT(std::stoull(*stopping), kBytes);
  victim.signal(SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(victim.wait(milliseconds(5000)), std::optional<int>(128 + SIGKILL));

  for (int r = 0; r < kSize; ++r) {
    if (r == kVictim) continue;
    auto o = finish(workers[static_cast<std::size_t>(r)], killed_at, late_bound(kTimeout));
    ASSERT_TRUE(o.exit_code.has_value()) << "rank " << r << " hung; printed:\n" << o.output;
    const bool typed = o.last_line.rfind("error PeerError: ", 0) == 0 ||
                       o.last_line.rfind("error TimeoutError: ", 0) == 0;
    EXPECT_TRUE(typed) << "rank " << r << " ended with: " << o.last_line;
    EXPECT_TRUE(*o.exit_code == 2 || *o.exit_code == 3) << "rank " << r << " exit " << *o.exit_code;
    EXPECT_LE(o.after, kTimeout + kSchedulingAllowance)
        << "rank " << r << " took longer than its deadline";
    if (r == kVictim - 1 || r == kVictim + 1) {
      // The victim's chain neighbours see its connection go and must name it.
      EXPECT_EQ(o.last_line.rfind("error PeerError: ", 0), 0u) << "rank " << r;
      EXPECT_NE(o.last_line.find("[peer: rank 2]"), std::string::npos) << o.last_line;
    }
    std::printf("rank %d after %lld ms: %s\n", r, static_cast<long long>(o.after.count()),
                o.last_line.c_str());
  }
}

// The same with single copy (four processes of one host): rank 2 freezes once it has copied 8 MiB
// of the root's 128 MiB and is SIGKILLed. The copies run down the chain 0 → 1 → 2 → 3, so the
// ranks that need rank 2 fail at once and name it: rank 3 copies out of rank 2's buffer, rank 1
// waits for rank 2 to hold every byte of its own. The root's buffer was read by rank 1 only, which
// copied all of it, so the root may end "ok", but then with every byte right (the worker checks
// the pattern); no rank may hang. The deadline is long (kFastFailureDeadline) so that "before half
// of it" still proves "without waiting for it" when a loaded machine slows the survivors by
// seconds.
TEST_F(GlooProcessTest, ReceiverKilledMidCopyFailsTheRanksThatNeedIt) {
  if (!siblings_may_read_each_other()) {
    GTEST_SKIP() << "processes may not read each other's memory here (Yama ptrace_scope or "
                    "seccomp), so the group keeps sockets";
  }
  constexpr int kSize = 4;
  constexpr int kVictim = 2;
  constexpr milliseconds kTimeout = kFastFailureDeadline;
  auto workers = spawn_ranks("killed-copy", kSize,
                             {.size = kSize, .root = 0, .bytes = 128u << 20, .timeout = kTimeout},
                             [&](WorkerArgs& w) {
                               if (w.rank == kVictim) w.stop_at_bytes = 8u << 20;
                             });
  auto& victim = workers[kVictim];
  ASSERT_TRUE(victim.wait_for_line("stopping ", late_bound(kTimeout)).has_value())
      << "victim never got mid-copy:\n"
      << victim.drain(milliseconds(100));
  victim.signal(SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(victim.wait(milliseconds(5000)), std::optional<int>(128 + SIGKILL));
  for (int r : {0, 1, 3}) {
    auto o = finish(workers[static_cast<std::size_t>(r)], killed_at, late_bound(kTimeout));
    ASSERT_TRUE(o.exit_code.has_value()) << "rank " << r << " hung; printed:\n" << o.output;
    EXPECT_NE(o.output.find("path single-copy\n"), std::string::npos) << o.output;
    EXPECT_LT(o.after, fast_bound(kTimeout)) << "rank " << r << " waited for its deadline";
    if (r == 0 && o.last_line == "ok") continue;
    EXPECT_EQ(o.last_line.rfind("error PeerError: ", 0), 0u) << "rank " << r << ": " << o.last_line;
    EXPECT_EQ(o.exit_code, std::optional<int>(3)) << "rank " << r;
    if (r != 0) {
      EXPECT_NE(o.last_line.find("[peer: rank 2]"), std::string::npos) << o.last_line;
    }
    std::printf("rank %d after %lld ms: %s\n", r, static_cast<long long>(o.after.count()),
                o.last_line.c_str());
  }
}

}  // namespace
}  // namespace weightcast::comm

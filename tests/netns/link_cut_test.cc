// Case 5 of the fault matrix: the link between two hosts is cut in the middle of an update.
//
// Three hosts on a private switch (network namespaces, tests/netns/netns_topology.h): h0 runs
// the trainer (link_cut_driver: a DistributedUpdater), h1 engine A, h2 engine B, each engine
// bound to its host's address. The Gloo chain runs trainer -> A -> B. After update 1 commits,
// update 2 is held at the start of one bucket, A's switch port goes down, and the update goes on:
// no byte of that bucket reaches anyone, and no one is told (a cut sends no RST).
//
// What must hold: every participant fails within [0.5x, 2x] of its own deadline with a typed
// error (the engines: their collective timeout, a TimeoutError; the trainer: its data-phase
// deadline, naming A); nothing is committed anywhere (both engines keep version 1 and its
// digest, read over HTTP from inside their namespaces); once the link is back, the same trainer
// creates a new group and a full update commits on both engines, with the digests the generator
// predicts. B is resumed (continue_generation) by the trainer's abort path, so it serves again
// only once the trainer gave up: the trainer waits out its calls to the silent A. The measured
// figures are printed as one "FIGURE case=5 ..." line.
#include <signal.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/model/model.h"
#include "sync/trainer/http/engine_client.h"
#include "tests/netns/netns_topology.h"
#include "tests/support/engine_http.h"
#include "tests/support/engine_launch.h"
#include "tests/support/subprocess.h"
#include "tests/support/time_bounds.h"

#ifndef WEIGHTCAST_ENGINE_BIN
#error "WEIGHTCAST_ENGINE_BIN must name the weightcast-engine executable"
#endif
#ifndef WEIGHTCAST_LINK_CUT_DRIVER_BIN
#error "WEIGHTCAST_LINK_CUT_DRIVER_BIN must name the link_cut_driver executable"
#endif

namespace weightcast::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using sync::trainer::EngineClient;

constexpr std::uint64_t kSeed = 7;
constexpr int kCutBucket = 2;
// The engines' collective timeout (--comm-timeout-ms) and the trainer's data-phase deadline.
// The trainer's is longer so that each engine fails on its own deadline, not on the trainer's
// abort.
constexpr auto kEngineDeadline = 3000ms;
constexpr auto kSenderDeadline = 5000ms;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Engine {
  std::string ns;
  std::unique_ptr<Subprocess> process;
  std::string url;
};

Engine start_engine(const NetnsTopology& net, int host) {
  const std::string address = net.host_address(host);
  auto argv =
      net.exec_argv(host, {WEIGHTCAST_ENGINE_BIN, "--host", address, "--comm-address", address,
                           "--port", "0", "--model", "tiny", "--seed", std::to_string(kSeed),
                           "--draft", "--comm-timeout-ms", std::to_string(kEngineDeadline.count()),
                           "--init-timeout-ms", "10000", "--session-timeout-ms", "30000"});
  Engine e{net.host_namespace(host), std::make_unique<Subprocess>(argv), ""};
  e.url = testing::wait_for_engine_url(*e.process, 30s);
  return e;
}

EngineClient client(const Engine& e) {
  sync::trainer::EngineClientOptions o;
  o.connect_timeout = 1000ms;
  o.request_timeout = 5000ms;
  return EngineClient(e.url, o);
}

// What an engine has committed, read over HTTP from inside its own namespace.
struct Committed {
  std::string version;
  std::string digest;
  bool in_session = true;
  bool paused = true;
  std::string failed_updates;  // weightcast_engine_updates_total{outcome="failed"}
};

Committed read_committed(const Engine& e) {
  Committed c;
  run_in_namespace(e.ns, [&] {
    auto api = client(e);
    const auto sum = api.weights_checksum(sync::Runner::kTarget);
    c.version = sum.weight_version;
    c.digest = sum.digest;
    const auto health = EngineHttp(e.url, {1000ms, 5000ms, 5000ms}).get("/health");
    if (health.status != 200) throw std::runtime_error("GET /health failed");
    const auto& state = health.body;
    c.in_session = state.at("in_session").get<bool>();
    c.paused = state.at("paused").get<bool>();
    std::smatch m;
    const std::string metrics = api.metrics();
    if (std::regex_search(
            metrics, m, std::regex(R"(weightcast_engine_updates_total\{outcome="failed"\} (\S+))")))
      c.failed_updates = m[1];
  });
  return c;
}

// Expects every engine of `engines` to have committed `version` with target digest `digest`, and
// runs `more(engine, committed)` for the checks of the caller; returns whether all of them held
// that version and digest.
bool expect_committed(std::initializer_list<const Engine*> engines, const std::string& version,
                      const std::string& digest,
                      const std::function<void(const Engine&, const Committed&)>& more = {}) {
  bool held = true;
  for (const Engine* e : engines) {
    const Committed c = read_committed(*e);
    held = held && c.version == version && c.digest == digest;
    EXPECT_EQ(c.version, version) << e->url;
    EXPECT_EQ(c.digest, digest) << e->url;
    if (more) more(*e, c);
  }
  return held;
}

// /server_info as the engine wrote it (groups, abort reasons), for failure messages.
std::string server_info_text(const Engine& e) {
  std::string text = "(no answer)";
  run_in_namespace(e.ns, [&] {
    const auto info = EngineHttp(e.url, {1000ms, 5000ms, 5000ms}).get("/server_info");
    if (info.status != 0) text = info.text;
  });
  return text;
}

// The target runner's digest after a committed update of generator step `step` (layout none).
std::string expected_target_digest(std::uint64_t step) {
  std::vector<sync::NamedDigest> entries;
  for (const auto& meta : sync::target_tensors(sync::model_preset("tiny"))) {
    std::vector<std::byte> bytes(meta.byte_count());
    sync::fill_tensor(meta, kSeed, step, bytes);
    entries.push_back({meta.name, sync::tensor_digest(bytes)});
  }
  return sync::to_string(sync::combined_digest(std::move(entries)));
}

// Polls an engine's /server_info from inside its namespace (every 20 ms) and records when its
// group was first seen aborted, and why, then when it was first seen serving again (not paused:
// the trainer's abort path reached it).
class EngineWatch {
 public:
  struct Abort {
    Clock::time_point at;
    std::string reason;
  };

  explicit EngineWatch(const Engine& e)
      : thread_([this, ns = e.ns, url = e.url](std::stop_token stop) { run(stop, ns, url); }) {}

  std::optional<Abort> aborted() const {
    std::lock_guard lock(mu_);
    return aborted_;
  }
  std::optional<Clock::time_point> resumed() const {
    std::lock_guard lock(mu_);
    return resumed_;
  }

 private:
  void run(std::stop_token stop, const std::string& ns, const std::string& url) {
    try {
      enter_namespace(ns);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "EngineWatch: %s\n", e.what());
      return;  // nothing seen: the test fails on that
    }
    const EngineHttp http(url, {500ms, 1000ms, 1000ms});
    for (; !stop.stop_requested(); std::this_thread::sleep_for(20ms)) {
      const auto res = http.get("/server_info");
      if (res.status != 200) continue;
      const auto& info = res.body;
      std::lock_guard lock(mu_);
      if (aborted_ && !info.at("paused").get<bool>()) {
        resumed_ = Clock::now();
        return;
      }
      for (const auto& g : info.at("groups")) {
        if (!aborted_ && g.at("aborted").get<bool>()) {
          aborted_ = Abort{Clock::now(), g.at("abort_reason").get<std::string>()};
        }
      }
    }
  }

  mutable std::mutex mu_;
  std::optional<Abort> aborted_;
  std::optional<Clock::time_point> resumed_;
  std::jthread thread_;
};

// Lines of the driver up to (not including) `until`, read within `timeout`.
std::vector<std::string> lines_until(Subprocess& p, const std::string& until,
                                     std::chrono::milliseconds timeout) {
  std::vector<std::string> out;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    auto line =
        p.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (!line || line->rfind(until, 0) == 0) break;
    out.push_back(*line);
  }
  return out;
}

// Every failure the trainer saw is typed: A's call timed out or found no one (A is silent), B
// answered 504 (its own TimeoutError) or, for a later bucket, 409 (its session was already over).
// Each side's own failure must be among them.
void expect_typed_failures(const std::vector<std::string>& details, const std::string& a_url,
                           const std::string& b_url, const std::string& output) {
  bool a_timed_out = false, b_504 = false;
  for (std::size_t i = 1; i < details.size(); ++i) {
    const std::string& f = details[i];
    ASSERT_EQ(f.rfind("failure engine=", 0), 0u) << f;
    const bool silent = f.find(" timed_out=1 ") != std::string::npos ||
                        f.find(" unreachable=1 ") != std::string::npos;
    const bool answered =
        f.find(": HTTP 504: ") != std::string::npos || f.find(": HTTP 409: ") != std::string::npos;
    EXPECT_TRUE(silent || answered) << "untyped failure: " << f;
    a_timed_out = a_timed_out || (f.rfind("failure engine=" + a_url + " ", 0) == 0 && silent);
    b_504 = b_504 || (f.rfind("failure engine=" + b_url + " ", 0) == 0 &&
                      f.find(": HTTP 504: ") != std::string::npos);
  }
  EXPECT_TRUE(a_timed_out) << output;
  EXPECT_TRUE(b_504) << output;
}

// One run of the case: two engines and the driver in a three-host topology; the steps below
// are the test's phases, in order. The topology is declared first, so it is destroyed last:
// every process in it is gone by then.
class LinkCutRun {
 public:
  NetnsTopology net{3};
  Engine a = start_engine(net, 1);
  Engine b = start_engine(net, 2);
  // 13 buckets of "tiny", each followed by a short pause; the deadlines of the header.
  Subprocess driver{net.exec_argv(
      0,
      {WEIGHTCAST_LINK_CUT_DRIVER_BIN, "--engines=" + a.url + "," + b.url,
       "--bind=" + net.host_address(0), "--seed=" + std::to_string(kSeed), "--bucket-bytes=262144",
       "--bucket-delay-ms=100", "--cut-before-bucket=" + std::to_string(kCutBucket),
       "--data-timeout-ms=" + std::to_string(kSenderDeadline.count()),
       "--group-timeout-ms=" + std::to_string(kSenderDeadline.count()), "--request-timeout-ms=2000",
       "--connect-timeout-ms=1000", "--failure-grace-ms=500"})};

  // Update 1 commits on both engines.
  void first_update() {
    auto line = driver.wait_for_line("update 1 ", 30s);
    ASSERT_TRUE(line && line->rfind("version 1 ", 0) == 0) << driver.output();
    ASSERT_TRUE(driver.wait_for_line("verify 1 ok", 10s)) << driver.output();
    ASSERT_TRUE(driver.wait_for_line("waiting before update 2", 10s)) << driver.output();
    ASSERT_TRUE(expect_committed({&a, &b}, "1", step1));
  }

  // Update 2, held before bucket kCutBucket: cut A's link, then let it go on; the trainer fails
  // it within its deadline, naming A.
  void cut_second_update() {
    driver.signal(SIGUSR1);
    ASSERT_TRUE(driver.wait_for_line("cut-point bucket", 30s)) << driver.output();
    net.set_link(1, false);
    cut = Clock::now();
    driver.signal(SIGUSR1);

    auto line = driver.wait_for_line("update 2 ", 3 * kSenderDeadline);
    returned_after = seconds(Clock::now() - cut);
    ASSERT_TRUE(line) << driver.output();
    EXPECT_NE(line->find("FAILED version 2"), std::string::npos) << *line;
    const auto details = lines_until(driver, "waiting before update 3", 10s);
    ASSERT_FALSE(details.empty()) << driver.output();
    char failed_engine[256] = {0};
    ASSERT_EQ(std::sscanf(details[0].c_str(), "data_seconds %lf failed_engine %255s", &data_seconds,
                          failed_engine),
              2)
        << details[0];
    EXPECT_EQ(std::string(failed_engine), a.url) << driver.output();
    expect_typed_failures(details, a.url, b.url, driver.output());
  }

  // Both engines fail on their own collective deadline; waits for the slower one (bounded).
  void expect_engines_timed_out(EngineWatch& watch_a, EngineWatch& watch_b) {
    const auto watch_deadline = cut + late_bound(kEngineDeadline) + 2s;
    while ((!watch_a.aborted() || !watch_b.aborted()) && Clock::now() < watch_deadline) {
      std::this_thread::sleep_for(20ms);
    }
    const auto seen_a = watch_a.aborted(), seen_b = watch_b.aborted();
    ASSERT_TRUE(seen_a) << "engine A never failed its group; " << server_info_text(a) << "\n"
                        << driver.output();
    ASSERT_TRUE(seen_b) << "engine B never failed its group; " << server_info_text(b) << "\n"
                        << driver.output();
    a_fail = seconds(seen_a->at - cut);
    b_fail = seconds(seen_b->at - cut);
    for (const auto& [who, took, reason] :
         {std::tuple{"A", a_fail, seen_a->reason}, std::tuple{"B", b_fail, seen_b->reason}}) {
      EXPECT_GE(took, 0.5 * engine_deadline) << who << ": " << reason;
      EXPECT_LE(took, late_bound_s(engine_deadline)) << who << ": " << reason;
      EXPECT_NE(reason.find("timed out"), std::string::npos) << who << ": " << reason;
    }
    EXPECT_GE(data_seconds, 0.5 * sender_deadline) << driver.output();
    EXPECT_LE(data_seconds, late_bound_s(sender_deadline)) << driver.output();
    EXPECT_LE(returned_after, late_bound_s(sender_deadline)) << driver.output();
  }

  // Nothing committed anywhere: both keep version 1 and its digest, no session is open. The
  // trainer's abort path resumed B on its previous weights, within the trainer's bound; A, cut
  // off, stays paused.
  void expect_nothing_committed(EngineWatch& watch_b) {
    nothing_committed =
        expect_committed({&a, &b}, "1", step1, [](const Engine& e, const Committed& c) {
          EXPECT_FALSE(c.in_session) << e.url;
          EXPECT_EQ(c.failed_updates, "1") << e.url;
        });
    const auto b_resumed = watch_b.resumed();
    ASSERT_TRUE(b_resumed) << driver.output();
    b_resume = seconds(*b_resumed - cut);
    EXPECT_LE(b_resume, late_bound_s(sender_deadline));
    EXPECT_TRUE(read_committed(a).paused);
  }

  // Link back: the same trainer builds a new group and a full update commits everywhere.
  void restore_and_recover() {
    net.set_link(1, true);
    const auto restored = Clock::now();
    driver.signal(SIGUSR1);
    auto line = driver.wait_for_line("update 3 ", 30s);
    recovery = seconds(Clock::now() - restored);
    ASSERT_TRUE(line && line->rfind("version 2 ", 0) == 0) << driver.output();
    recovered = driver.wait_for_line("verify 3 ok", 10s).has_value();
    EXPECT_TRUE(recovered) << driver.output();
    EXPECT_EQ(driver.wait(10s), std::optional<int>(0)) << driver.output();
    const std::string step3 = expected_target_digest(3);
    recovered = expect_committed(
                    {&a, &b}, "2", step3,
                    [](const Engine& e, const Committed& c) { EXPECT_FALSE(c.paused) << e.url; }) &&
                recovered;
  }

  void print_figure() const {
    std::printf(
        "FIGURE case=5 engine_deadline_s=%.3f sender_deadline_s=%.3f cut_engine_fail_s=%.3f "
        "other_engine_fail_s=%.3f other_engine_resumed_s=%.3f sender_data_phase_s=%.3f "
        "sender_return_after_cut_s=%.3f "
        "recovery_update_s=%.3f committed_during_cut=%s recovered=%s\n",
        engine_deadline, sender_deadline, a_fail, b_fail, b_resume, data_seconds, returned_after,
        recovery, nothing_committed ? "no" : "yes", recovered ? "yes" : "no");
    std::fflush(stdout);
  }

 private:
  const std::string step1 = expected_target_digest(1);
  const double engine_deadline = seconds(kEngineDeadline);
  const double sender_deadline = seconds(kSenderDeadline);
  Clock::time_point cut;
  double data_seconds = -1, returned_after = 0, a_fail = 0, b_fail = 0, b_resume = 0;
  double recovery = 0;
  bool nothing_committed = false, recovered = false;
};

TEST(NetnsLinkCut, CutMidUpdateFailsInBoundedTimeCommitsNothingAndRecovers) {
  if (auto why = netns_unavailable_reason()) GTEST_SKIP() << *why;
  LinkCutRun run;
  run.first_update();
  if (HasFatalFailure()) return;
  EngineWatch watch_a(run.a), watch_b(run.b);
  run.cut_second_update();
  if (HasFatalFailure()) return;
  run.expect_engines_timed_out(watch_a, watch_b);
  if (HasFatalFailure()) return;
  run.expect_nothing_committed(watch_b);
  if (HasFatalFailure()) return;
  run.restore_and_recover();
  run.print_figure();
}

}  // namespace
}  // namespace weightcast::testing

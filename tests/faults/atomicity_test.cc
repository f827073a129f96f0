// Case 6 of the fault list: version atomicity as readers see it. While a trainer runs updates in
// a loop (some of them made to fail after every bucket was staged, or in the middle of the data
// phase, carrying other bytes than the version's), readers poll /weights_checksum and
// /server_info of both engines. Every answer must pair its weight_version with exactly that
// version's digests (the generator tells which digest belongs to which version), each engine's
// version must only grow, and no engine may be at version v+1 before every engine committed v.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/faults/fault_support.h"
#include "tests/faults/faulty_engine.h"

namespace weightcast::faults {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kCommits = 16;
// A failed attempt sends these bytes under the version it would have committed; an engine that
// committed them anyway would report that version with a digest no version has.
constexpr std::uint64_t kWrongStep = 1000;

struct Violations {
  std::mutex mu;
  std::vector<std::string> list;  // the first few, for the failure message
  std::atomic<long> count{0};
  void add(std::string what) {
    count += 1;
    std::lock_guard lock(mu);
    if (list.size() < 20) list.push_back(std::move(what));
  }
};

// Reader threads, stopped and joined on every exit path (an ASSERT included).
struct Readers {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  void join() {
    stop = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
  ~Readers() { join(); }
};

// "default" -> 0, "7" -> 7; nullopt for anything else.
std::optional<std::uint64_t> version_number(const std::string& text) {
  if (text == "default") return 0;
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return {};
  return std::stoull(text);
}

// One reader of one engine's /weights_checksum: returns the version it saw (nullopt on a
// violation or no answer), checking it against the digest of the same answer.
std::optional<std::uint64_t> read_version(const std::string& url, Violations& v,
                                          std::atomic<long>& polls) {
  const auto a = http_get(url, "/weights_checksum?runner=target");
  if (a.status != 200) {
    v.add(url + ": /weights_checksum answered " + std::to_string(a.status));
    return {};
  }
  polls += 1;
  const std::string text = a.body.value("weight_version", "");
  const auto version = version_number(text);
  if (!version || *version > kCommits) {
    v.add(url + ": version '" + text + "' was never committed");
    return {};
  }
  if (a.body.value("digest", "") != target_digest_at(*version)) {
    v.add(url + ": version " + text + " reported with digest " + a.body.value("digest", "") +
          ", which is not that version's");
    return {};
  }
  return version;
}

// What the readers saw, shared by their threads.
struct ReaderTallies {
  Violations violations;
  std::atomic<long> checksum_polls{0}, info_polls{0}, in_session_seen{0}, cross_checks{0};
  std::mutex seen_mu;
  std::set<std::uint64_t> versions_seen;
};

// Per-engine readers: the digest must match the version, and the version only grows (on
// /weights_checksum and on /server_info).
void start_engine_readers(Readers& readers, const std::string& url, ReaderTallies& t) {
  const std::atomic<bool>& stop = readers.stop;
  readers.threads.emplace_back([&stop, &t, url] {
    std::uint64_t last = 0;
    while (!stop) {
      const auto v = read_version(url, t.violations, t.checksum_polls);
      if (!v) continue;
      if (*v < last) t.violations.add(url + ": version went back from " + std::to_string(last));
      last = std::max(last, *v);
      std::lock_guard lock(t.seen_mu);
      t.versions_seen.insert(*v);
    }
  });
  readers.threads.emplace_back([&stop, &t, url] {
    std::uint64_t last = 0;
    while (!stop) {
      const auto a = http_get(url, "/server_info");
      if (a.status != 200) continue;
      t.info_polls += 1;
      if (a.body.value("in_session", false)) t.in_session_seen += 1;
      const auto v = version_number(a.body.value("weight_version", ""));
      if (!v || *v > kCommits || *v < last) {
        t.violations.add(url + ": /server_info weight_version " + a.body.dump().substr(0, 200));
        continue;
      }
      last = *v;
    }
  });
}

// Cross-engine reader: A, then B, then A again. B may lag A's first read by one version and
// lead A's second read by one, never more: an update starts only after the previous one
// committed on every engine.
void start_cross_reader(Readers& readers, const std::vector<std::string>& urls, ReaderTallies& t) {
  const std::atomic<bool>& stop = readers.stop;
  readers.threads.emplace_back([&stop, &t, urls] {
    while (!stop) {
      const auto a1 = read_version(urls[0], t.violations, t.checksum_polls);
      const auto b = read_version(urls[1], t.violations, t.checksum_polls);
      const auto a2 = read_version(urls[0], t.violations, t.checksum_polls);
      if (!a1 || !b || !a2) continue;
      t.cross_checks += 1;
      if (*b + 1 < *a1 || *b > *a2 + 1) {
        t.violations.add("engine versions apart by more than one update: A " + std::to_string(*a1) +
                         ", B " + std::to_string(*b) + ", A " + std::to_string(*a2));
      }
    }
  });
}

// The trainer's loop: kCommits versions, every fourth attempt failed on engine B (its commit
// phase, or every eighth its fourth bucket) while carrying other bytes than the version's.
struct UpdateLoop {
  std::uint64_t committed = 0;
  int attempts = 0, failed = 0;
  double seconds = 0;

  void run(const std::vector<std::string>& urls) {
    const auto options = updater_options(TrainerConfig{});
    auto [faulty, apis] = faulty_clients(urls, options);
    std::atomic<int> arm{0};  // 0: none, 1: commit, 2: data phase
    std::atomic<int> bucket_calls{0};
    faulty[1]->before = [&arm, &bucket_calls, url = urls[1]](const std::string& route) {
      if (arm == 1 && route == "POST /update_weight_version") {
        throw comm::PeerError(url, "injected: trainer lost engine B before commit");
      }
      if (arm == 2 && route == "POST /update_weights_from_distributed" && ++bucket_calls == 4) {
        throw comm::PeerError(url, "injected: trainer lost engine B mid-data");
      }
    };
    sync::trainer::DistributedUpdater updater(std::move(apis), options);
    const auto start = Clock::now();
    while (committed < kCommits && attempts < 3 * static_cast<int>(kCommits)) {
      ++attempts;
      const bool inject = attempts % 4 == 0;
      arm = inject ? (attempts % 8 == 0 ? 2 : 1) : 0;
      bucket_calls = 0;
      const auto report =
          updater.update(views_at(inject ? kWrongStep + committed + 1 : committed + 1));
      if (inject) {
        EXPECT_FALSE(report.ok) << "attempt " << attempts << " should have failed";
        ++failed;
        continue;
      }
      ASSERT_TRUE(report.ok) << report_text(report);
      EXPECT_EQ(report.version, std::to_string(committed + 1));
      ++committed;
    }
    seconds = ms_between(start, Clock::now()) / 1000;
  }
};

TEST(VersionAtomicity, ReadersNeverSeeAVersionWithoutItsDigestsNorAnEngineAhead) {
  std::vector<std::unique_ptr<EnginePeer>> engines;
  engines.push_back(std::make_unique<EnginePeer>(EngineConfig{}));
  engines.push_back(std::make_unique<EnginePeer>(EngineConfig{}));
  const std::vector<std::string> urls = {engines[0]->url(), engines[1]->url()};
  for (std::uint64_t v = 0; v <= kCommits; ++v) target_digest_at(v);  // precomputed

  ReaderTallies t;
  Readers readers;
  for (const auto& url : urls) start_engine_readers(readers, url, t);
  start_cross_reader(readers, urls, t);

  UpdateLoop loop;
  loop.run(urls);
  if (HasFatalFailure()) return;
  std::this_thread::sleep_for(50ms);
  readers.join();

  for (const auto& v : t.violations.list) ADD_FAILURE() << v;
  EXPECT_EQ(loop.committed, kCommits);
  for (const auto& url : urls) expect_engine_at(url, kCommits, "after the loop");
  // Not vacuous: the readers ran during sessions and saw the versions move.
  EXPECT_GT(t.in_session_seen.load(), 0) << "no reader ever overlapped an update";
  EXPECT_GE(t.versions_seen.size(), kCommits / 2) << "readers saw too few versions";
  EXPECT_GT(t.cross_checks.load(), 10);
  std::ostringstream fig;
  fig << "case=6 commits=" << loop.committed << " failed_attempts=" << loop.failed
      << " seconds=" << loop.seconds << " checksum_polls=" << t.checksum_polls.load()
      << " server_info_polls=" << t.info_polls.load()
      << " polls_in_session=" << t.in_session_seen.load()
      << " cross_engine_checks=" << t.cross_checks.load()
      << " versions_seen=" << t.versions_seen.size() << " violations=" << t.violations.count.load();
  figure(fig.str());
}

}  // namespace
}  // namespace weightcast::faults

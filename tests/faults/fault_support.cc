#include "tests/faults/fault_support.h"

#include "tests/support/engine_launch.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "sync/engine/runners/weights.h"
#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"
#include "sync/trainer/http/engine_client.h"

#ifndef WEIGHTCAST_ENGINE_BIN
#error "WEIGHTCAST_ENGINE_BIN must name the weightcast-engine executable"
#endif

namespace weightcast::faults {

using namespace std::chrono_literals;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

HttpAnswer http_get(const std::string& url, const std::string& path, Millis timeout) {
  return testing::EngineHttp(url, {timeout, timeout, timeout}).get(path);
}

HttpAnswer http_post(const std::string& url, const std::string& path, const std::string& body,
                     Millis timeout) {
  return testing::EngineHttp(url, {timeout, timeout, timeout}).post(path, body);
}

EnginePeer::EnginePeer(EngineConfig config) : config_(std::move(config)) {
  std::vector<std::string> flags = {
      "--comm-timeout-ms",    std::to_string(config_.comm_timeout.count()),
      "--session-timeout-ms", std::to_string(config_.session_timeout.count()),
      "--init-timeout-ms",    std::to_string(config_.init_timeout.count())};
  flags.insert(flags.end(), config_.extra.begin(), config_.extra.end());
  process_ = std::make_unique<testing::Subprocess>(
      testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, config_.ranks, kSeed, flags));
  url_ = testing::wait_for_engine_url(*process_, 30s);
  port_ = testing::url_port(url_);
}

EngineState engine_state(const std::string& url) {
  EngineState s;
  const auto target = http_get(url, "/weights_checksum?runner=target");
  const auto draft = http_get(url, "/weights_checksum?runner=draft");
  const auto health = http_get(url, "/health");
  if (target.status != 200 || draft.status != 200 || health.status != 200) {
    ADD_FAILURE() << "engine " << url << " did not answer: " << target.status << " " << draft.status
                  << " " << health.status;
    return s;
  }
  s.version = target.body.value("weight_version", "");
  s.target_digest = target.body.value("digest", "");
  s.draft_digest = draft.body.value("digest", "");
  s.in_session = health.body.value("in_session", true);
  s.paused = health.body.value("paused", true);
  return s;
}

namespace {

const sync::ModelSpec& spec() {
  static const sync::ModelSpec s = sync::model_preset("tiny");
  return s;
}

}  // namespace

std::string shuffled_digest(const std::vector<sync::trainer::NamedTensor>& tensors) {
  std::vector<sync::NamedDigest> entries;
  for (const auto& t : tensors) {
    std::vector<std::byte> bytes(t.bytes.begin(), t.bytes.end());
    sync::apply_layout(sync::Layout::kShuffle, t.meta, bytes);
    entries.push_back({t.meta.name, sync::tensor_digest(bytes)});
  }
  return sync::to_string(sync::combined_digest(std::move(entries)));
}

namespace {

std::string laid_out_digest(const std::vector<sync::engine::RawTensor>& tensors) {
  std::vector<sync::trainer::NamedTensor> views;
  for (const auto& t : tensors) views.push_back({t.meta, t.bytes});
  return shuffled_digest(views);
}

// Generating and hashing "tiny" takes milliseconds, but tests ask for the same versions often.
struct VersionCache {
  std::mutex mu;
  std::map<std::uint64_t, std::vector<sync::trainer::HostTensor>> weights;
  std::map<std::uint64_t, std::string> digests;
};

VersionCache& cache() {
  static VersionCache c;
  return c;
}

}  // namespace

const std::vector<sync::trainer::HostTensor>& weights_at(std::uint64_t v) {
  auto& c = cache();
  std::lock_guard lock(c.mu);
  auto it = c.weights.find(v);
  if (it != c.weights.end()) return it->second;
  std::vector<sync::trainer::HostTensor> out;
  for (auto& t : sync::engine::generate_weights(sync::target_tensors(spec()), kSeed, v)) {
    out.push_back({std::move(t.meta), std::move(t.bytes)});
  }
  return c.weights.emplace(v, std::move(out)).first->second;
}

std::vector<sync::trainer::NamedTensor> views_at(std::uint64_t v) {
  return sync::trainer::views(weights_at(v));
}

const std::string& target_digest_at(std::uint64_t v) {
  auto& c = cache();
  {
    std::lock_guard lock(c.mu);
    auto it = c.digests.find(v);
    if (it != c.digests.end()) return it->second;
  }
  const std::string d =
      laid_out_digest(sync::engine::generate_weights(sync::target_tensors(spec()), kSeed, v));
  std::lock_guard lock(c.mu);
  return c.digests.emplace(v, d).first->second;
}

const std::string& draft_digest() {
  static const std::string d =
      laid_out_digest(sync::engine::generate_weights(sync::draft_tensors(spec()), kSeed, 0));
  return d;
}

void expect_engine_at(const std::string& url, std::uint64_t v, const std::string& who) {
  const EngineState s = engine_state(url);
  EXPECT_EQ(s.version, v == 0 ? std::string("default") : std::to_string(v)) << who << " " << url;
  EXPECT_EQ(s.target_digest, target_digest_at(v)) << who << " target holds version " << v;
  EXPECT_EQ(s.draft_digest, draft_digest()) << who << " frozen draft is bit-identical";
}

sync::trainer::UpdaterOptions updater_options(const TrainerConfig& config) {
  sync::trainer::UpdaterOptions o;
  o.selector = sync::Selector::kTarget;
  // These faults are injected on the chain's routes and groups; the colocated path has its own
  // (tests/sync/trainer/colocate_e2e_test.cc).
  o.colocate = sync::trainer::ColocateMode::kOff;
  o.buckets.bucket_bytes = config.bucket_bytes;
  o.buckets.bucket_delay = config.bucket_delay;
  o.buckets.timeout = config.data_timeout;
  o.buckets.failure_grace = config.failure_grace;
  o.connect_timeout = Millis(1000);
  o.request_timeout = config.request_timeout;
  o.group_timeout = config.group_timeout;
  return o;
}

std::unique_ptr<sync::trainer::EngineApi> engine_client(const std::string& url,
                                                        const sync::trainer::UpdaterOptions& o) {
  sync::trainer::EngineClientOptions c;
  c.connect_timeout = o.connect_timeout;
  c.request_timeout = o.request_timeout;
  c.data_timeout = std::max(o.buckets.timeout, o.group_timeout);
  return std::make_unique<sync::trainer::EngineClient>(url, c);
}

std::unique_ptr<sync::trainer::DistributedUpdater> make_updater(
    const std::vector<std::string>& urls, const TrainerConfig& config) {
  return std::make_unique<sync::trainer::DistributedUpdater>(urls, updater_options(config));
}

ProcStats proc_stats(pid_t pid) {
  ProcStats s;
  const std::string base = "/proc/" + std::to_string(pid);
  if (DIR* d = ::opendir((base + "/fd").c_str())) {
    s.fds = 0;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    ::closedir(d);
  }
  std::ifstream status(base + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoi(line.substr(8));
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kib = std::stol(line.substr(6));
  }
  return s;
}

ProcStats steady_stats(pid_t pid) {
  ProcStats last = proc_stats(pid);
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(50ms);
    const ProcStats now = proc_stats(pid);
    if (now.fds == last.fds && now.threads == last.threads) return now;
    last = now;
  }
  return last;
}

namespace {

std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256];
    const auto n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string link(target, static_cast<std::size_t>(n));
    if (link.rfind("socket:[", 0) == 0) out.insert(link.substr(8, link.size() - 9));
  }
  ::closedir(d);
  return out;
}

}  // namespace

std::set<int> listening_ports(pid_t pid) {
  const auto inodes = socket_inodes(pid);
  std::set<int> ports;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      ports.insert(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

std::future<std::optional<Clock::time_point>> watch_engine(
    const std::string& url, std::function<bool(const nlohmann::json&)> done, Millis limit) {
  return std::async(std::launch::async,
                    [url, done = std::move(done), limit]() -> std::optional<Clock::time_point> {
                      const auto end = Clock::now() + limit;
                      while (Clock::now() < end) {
                        const auto a = http_get(url, "/server_info", Millis(500));
                        if (a.status == 200 && done(a.body)) return Clock::now();
                        std::this_thread::sleep_for(5ms);
                      }
                      return std::nullopt;
                    });
}

bool wait_engine(const std::string& url, const std::function<bool(const nlohmann::json&)>& done,
                 Millis limit) {
  return watch_engine(url, done, limit).get().has_value();
}

std::uint64_t buckets_received(const nlohmann::json& server_info, const std::string& group) {
  for (const auto& g : server_info.value("groups", nlohmann::json::array())) {
    if (g.value("group_name", "") == group) return g.value("buckets_received", std::uint64_t{0});
  }
  return 0;
}

std::string report_text(const sync::trainer::UpdateReport& report) {
  std::string text = sync::trainer::summary(report);
  for (const auto& f : report.failures) {
    text += "\n  " + sync::trainer::to_string(f) + (f.unreachable ? " (unreachable)" : "") +
            (f.timed_out ? " (timed out)" : "");
  }
  return text;
}

void figure(const std::string& text) {
  std::printf("FIGURE %s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace weightcast::faults

// Shared pieces of the fault-injection tests: weightcast-engine as a real process, the weights
// and digests the deterministic generator assigns to each version, a DistributedUpdater set up
// with short deadlines, views of a process from /proc (fds, threads, RSS, listening ports), a
// poller that timestamps when an engine reaches a state, and the "FIGURE ..." lines the tests
// print for docs/reliability.md.
//
// Conventions: model "tiny", seed kSeed, a target runner (shuffle layout) and a frozen draft
// (shuffle layout, filter "mtp.*", which matches nothing "tiny" sends). Version v of the weights
// is the generator's step v; version 0 is what an engine starts with ("default").
// Lifetime: EnginePeer kills its process on destruction (weightcast::testing::Subprocess).
// Threading: the HTTP helpers are safe from any thread; the rest belongs to the test's thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sync/trainer/tensors.h"
#include "sync/trainer/updater.h"
#include "tests/support/engine_http.h"
#include "tests/support/subprocess.h"

namespace weightcast::faults {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

inline constexpr std::uint64_t kSeed = 7;

// Milliseconds from `from` to `to`.
double ms_between(Clock::time_point from, Clock::time_point to);

// ---- HTTP (no token; every call bounded by `timeout`) ----

using testing::HttpAnswer;  // status 0: no answer (refused, reset, timed out)
HttpAnswer http_get(const std::string& url, const std::string& path, Millis timeout = Millis(2000));
HttpAnswer http_post(const std::string& url, const std::string& path, const std::string& body,
                     Millis timeout = Millis(2000));

// ---- engines ----

struct EngineConfig {
  int ranks = 1;
  Millis comm_timeout{3000};
  Millis session_timeout{3000};
  Millis init_timeout{3000};
  std::vector<std::string> extra;  // more flags
};

class EnginePeer {
 public:
  // Starts weightcast-engine on an ephemeral port and waits for its "listening on" line.
  explicit EnginePeer(EngineConfig config);
  const std::string& url() const { return url_; }
  int port() const { return port_; }
  pid_t pid() const { return process_->pid(); }
  const EngineConfig& config() const { return config_; }
  void signal(int sig) { process_->signal(sig); }
  testing::Subprocess& process() { return *process_; }

 private:
  EngineConfig config_;
  std::unique_ptr<testing::Subprocess> process_;
  std::string url_;
  int port_ = 0;
};

// What a reader of the engine sees: version and digests as one /weights_checksum answer each.
struct EngineState {
  std::string version;        // from /weights_checksum?runner=target
  std::string target_digest;  // combined
  std::string draft_digest;
  bool in_session = false;
  bool paused = false;
};
// Reads /weights_checksum (target, draft) and /health. Fails the test (ADD_FAILURE) and returns
// an empty state when the engine does not answer.
EngineState engine_state(const std::string& url);

// ---- weights of each version ----

// The tensors a trainer sends for version `v` (the generator's step v of the target's tensors).
const std::vector<sync::trainer::HostTensor>& weights_at(std::uint64_t v);
std::vector<sync::trainer::NamedTensor> views_at(std::uint64_t v);
// Combined digests an engine must report: the target after committing version v (v = 0: the
// initial weights), and the frozen draft (always its initial weights).
const std::string& target_digest_at(std::uint64_t v);
const std::string& draft_digest();
// The combined digest a runner with the shuffle layout reports after loading `tensors`.
std::string shuffled_digest(const std::vector<sync::trainer::NamedTensor>& tensors);
// Fails the test unless the engine holds version v exactly (version text, both digests).
void expect_engine_at(const std::string& url, std::uint64_t v, const std::string& who);

// ---- the trainer side ----

struct TrainerConfig {
  std::size_t bucket_bytes = 256 << 10;  // ~14 buckets for "tiny"
  Millis bucket_delay{0};
  Millis data_timeout{6000};  // the data phase (UpdaterOptions::buckets.timeout)
  Millis group_timeout{6000};
  Millis request_timeout{1500};
  Millis failure_grace{500};
};
sync::trainer::UpdaterOptions updater_options(const TrainerConfig& config);
// EngineClient options as DistributedUpdater derives them from `options`.
std::unique_ptr<sync::trainer::EngineApi> engine_client(const std::string& url,
                                                        const sync::trainer::UpdaterOptions& o);
std::unique_ptr<sync::trainer::DistributedUpdater> make_updater(
    const std::vector<std::string>& urls, const TrainerConfig& config);
// summary(report) and, for a failed one, every engine's failure (the summary names only the
// first): what a failed assertion should print.
std::string report_text(const sync::trainer::UpdateReport& report);

// ---- processes ----

struct ProcStats {
  int fds = -1;
  int threads = -1;
  long rss_kib = -1;
};
ProcStats proc_stats(pid_t pid);
// proc_stats() once fds and threads hold still (two samples 50 ms apart agree; at most 2 s):
// a server that just printed its port may still be starting its worker pool.
ProcStats steady_stats(pid_t pid);
// TCP ports `pid` listens on (its LISTEN sockets, IPv4 and IPv6).
std::set<int> listening_ports(pid_t pid);

// ---- timing ----

// Polls `url`'s /server_info every few milliseconds on a thread of its own until `done(answer)`
// holds or `limit` passes; the future gives the time it first held (nullopt: it never did).
std::future<std::optional<Clock::time_point>> watch_engine(
    const std::string& url, std::function<bool(const nlohmann::json&)> done, Millis limit);
// Waits (polling) until `done` holds for `url`'s /server_info; false after `limit`.
bool wait_engine(const std::string& url, const std::function<bool(const nlohmann::json&)>& done,
                 Millis limit);
// buckets_received of `url`'s group `group` (0 when it has none).
std::uint64_t buckets_received(const nlohmann::json& server_info, const std::string& group);

// Prints "FIGURE <text>" on its own line to stdout (flushed), for docs/reliability.md.
void figure(const std::string& text);

}  // namespace weightcast::faults

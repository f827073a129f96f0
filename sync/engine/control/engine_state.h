// Two pieces of Engine state with their own rules, as classes the Engine owns:
//   EngineCounters  the update counters /metrics reports (under the EngineContext lock);
//   ProbeCache      the last speculative accept-length answer, keyed by the weights it was
//                   computed on, dropped by /flush_cache (its own lock: a probe runs for a while
//                   and must not hold the Engine's).
// Lifetime/threading: owned by the EngineContext; see each class.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <variant>

#include "sync/engine/control/reply.h"

namespace weightcast::sync::engine {

// Not thread-safe: the Engine reads and writes it under its lock.
class EngineCounters {
 public:
  void update_ok(double seconds) {
    updates_ok_ += 1;
    last_update_seconds_ = seconds;
  }
  void update_failed() { updates_failed_ += 1; }
  void flushed() { flushes_ += 1; }

  // The update and flush counters in Prometheus text; `bytes_received` is the data plane's total.
  void write(std::ostream& os, std::uint64_t bytes_received) const;

 private:
  std::uint64_t updates_ok_ = 0;
  std::uint64_t updates_failed_ = 0;
  std::uint64_t flushes_ = 0;
  double last_update_seconds_ = 0;
};

// Thread-safe.
class ProbeCache {
 public:
  using Compute = std::function<std::variant<Reply, double>()>;
  // The cached accept length when `key` (what the weights are) is the cached one; else runs
  // `compute` under the cache's lock (concurrent probes compute once) and caches a value it
  // returns. A Reply from `compute` is a refusal, passed through and not cached.
  std::variant<Reply, double> get(const std::string& key, const Compute& compute);
  // /flush_cache: the next probe reads the weights again.
  void drop();
  // The last value computed, for /metrics (kept across drop()).
  std::optional<double> last() const;

 private:
  mutable std::mutex mu_;
  std::string key_;
  std::optional<double> value_;
};

// "# HELP" and "# TYPE" lines of one metric.
void metric_header(std::ostream& os, const char* name, const char* type, const char* help);

}  // namespace weightcast::sync::engine

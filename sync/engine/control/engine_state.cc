#include "sync/engine/control/engine_state.h"

namespace weightcast::sync::engine {

void metric_header(std::ostream& os, const char* name, const char* type, const char* help) {
  os << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

void EngineCounters::write(std::ostream& os, std::uint64_t bytes_received) const {
  metric_header(os, "weightcast_engine_updates_total", "counter",
                "Weight update sessions by outcome.");
  os << "weightcast_engine_updates_total{outcome=\"ok\"} " << updates_ok_ << '\n';
  os << "weightcast_engine_updates_total{outcome=\"failed\"} " << updates_failed_ << '\n';
  metric_header(os, "weightcast_engine_bytes_received_total", "counter",
                "Bucket bytes received on the data plane, summed over engine ranks.");
  os << "weightcast_engine_bytes_received_total " << bytes_received << '\n';
  metric_header(os, "weightcast_engine_last_update_duration_seconds", "gauge",
                "From begin_weight_update to the commit of the last successful update.");
  os << "weightcast_engine_last_update_duration_seconds " << last_update_seconds_ << '\n';
  metric_header(os, "weightcast_engine_cache_flushes_total", "counter", "Cache flushes.");
  os << "weightcast_engine_cache_flushes_total " << flushes_ << '\n';
}

std::variant<Reply, double> ProbeCache::get(const std::string& key, const Compute& compute) {
  std::lock_guard lock(mu_);
  if (value_ && key == key_) return *value_;
  auto result = compute();
  if (const double* v = std::get_if<double>(&result)) {
    value_ = *v;
    key_ = key;
  }
  return result;
}

void ProbeCache::drop() {
  std::lock_guard lock(mu_);
  key_.clear();
}

std::optional<double> ProbeCache::last() const {
  std::lock_guard lock(mu_);
  return value_;
}

}  // namespace weightcast::sync::engine

// WeightVersion: an engine's committed weight_version, in one place.
//
// The Receiver reads it (begin's answer, delta bases) and writes it (a commit, or
// update_weight_version outside a session); an engine whose readers must see the version together
// with the weights it names (weightcast-engine's RunnerSet) shares the same one with its Receiver
// and sets it in the commit's publish step, under its own lock. A session's staged version is not
// a weight_version until that commit (sync/engine/control/session.h keeps it).
// Lifetime: shared by its holders. Threading: thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <utility>

namespace weightcast::sync::engine {

class WeightVersion {
 public:
  explicit WeightVersion(std::string initial) : version_(std::move(initial)) {}
  WeightVersion(const WeightVersion&) = delete;
  WeightVersion& operator=(const WeightVersion&) = delete;

  std::string get() const {
    std::lock_guard lock(mu_);
    return version_;
  }
  void set(std::string version) {
    std::lock_guard lock(mu_);
    version_ = std::move(version);
  }

 private:
  mutable std::mutex mu_;
  std::string version_;
};

}  // namespace weightcast::sync::engine

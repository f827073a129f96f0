// FaultyEngine: an EngineApi decorator for fault injection on the trainer's side of the wire.
// It forwards every call to a real EngineClient, but can rewrite the init request first (a wrong
// world size, an unreachable store address) or fail a route before anything is sent, and it
// records every call (route, start, end, error) so a test can tell when each engine's answer
// came and what type of error it carried.
// Lifetime: owns the inner client. Threading: as EngineApi (calls arrive from many threads);
// set the hooks before handing the engine to an updater.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sync/trainer/engine_api.h"
#include "sync/trainer/updater.h"
#include "tests/support/engine_api_overrides.h"

namespace weightcast::faults {

struct CallRecord {
  std::string route;  // "POST /init_weights_update_group"
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
  bool ok = true;
  std::string error_type;  // "TimeoutError", "EngineError 504", ... when !ok
  std::string error;
};

class FaultyEngine final : public sync::trainer::EngineApi {
 public:
  explicit FaultyEngine(std::unique_ptr<sync::trainer::EngineApi> inner);

  // Applied to every init request before it is sent.
  std::function<void(sync::InitWeightsUpdateGroupRequest&)> rewrite_init;
  // Called with the route before each call is sent; throwing fails the call unsent.
  std::function<void(const std::string& route)> before;

  std::vector<CallRecord> calls() const;

  const std::string& url() const override { return inner_->url(); }
  sync::trainer::EngineFlavor flavor() const override { return inner_->flavor(); }
  bool sessions() const override { return inner_->sessions(); }
  void close_idle_connections() override { inner_->close_idle_connections(); }
  WEIGHTCAST_ENGINE_API_ROUTE_OVERRIDES;

 private:
  // Runs `fn` as call `route`: the hook first, then the call, recorded either way.
  template <typename Fn>
  auto run(const std::string& route, Fn&& fn) -> decltype(fn());

  std::unique_ptr<sync::trainer::EngineApi> inner_;
  mutable std::mutex mu_;
  std::vector<CallRecord> calls_;
};

// For each URL an engine client (engine_client() of fault_support.h) inside a FaultyEngine:
// `apis` to hand to the updater, and `faulty`, the same engines in URL order, to arm.
struct FaultyClients {
  std::vector<FaultyEngine*> faulty;
  std::vector<std::unique_ptr<sync::trainer::EngineApi>> apis;
};
FaultyClients faulty_clients(const std::vector<std::string>& urls,
                             const sync::trainer::UpdaterOptions& options);

}  // namespace weightcast::faults

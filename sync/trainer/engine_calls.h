// Fan-out of one engine route to every engine at once, and the translation of a failed call into
// an EngineFailure for reports.
//
// Concurrency, not a loop: a pause or begin that waits on one slow engine must not delay the
// others, and a dead engine must not hide whether the rest answered. Each call is bounded by the
// engine client's own connect/read timeouts, so waiting for all of them is bounded too.
// Threading: on_all_engines() runs `call` on one thread per engine; `call` must be thread-safe
// across engines.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sync/trainer/engine_api.h"
#include "sync/trainer/report.h"

namespace weightcast::sync::trainer {

// Runs call(engine, index) for every engine concurrently and waits for all. Returns one failure
// per engine whose call threw (in engine order); empty when all succeeded.
std::vector<EngineFailure> on_all_engines(
    std::span<EngineApi* const> engines, const std::string& route,
    const std::function<void(EngineApi& engine, std::size_t index)>& call);

// The exception being handled (call inside a catch block) as a failure of `engine` on `route`.
EngineFailure current_failure(const std::string& engine, const std::string& route);

// Several engines failed one step (server_info, group setup). peer() is the engine blame()
// picks; failures() lists them all.
class EngineCallError : public comm::PeerError {
 public:
  EngineCallError(const std::string& what, std::vector<EngineFailure> failures);
  const std::vector<EngineFailure>& failures() const { return failures_; }

 private:
  std::vector<EngineFailure> failures_;
};

// Throws EngineCallError("<what>: <blamed failure>") unless `failures` is empty.
void throw_if_failed(const std::string& what, std::vector<EngineFailure> failures);

}  // namespace weightcast::sync::trainer

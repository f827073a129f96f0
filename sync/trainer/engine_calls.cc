#include "sync/trainer/engine_calls.h"

#include <exception>
#include <future>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

namespace {

// PeerError appends " [peer: X]" to its message; a failure already names its engine.
std::string without_peer_suffix(std::string text, const std::string& engine) {
  const std::string suffix = " [peer: " + engine + "]";
  if (text.size() >= suffix.size() && text.ends_with(suffix))
    text.resize(text.size() - suffix.size());
  return text;
}

}  // namespace

EngineFailure current_failure(const std::string& engine, const std::string& route) {
  EngineFailure failure{engine, route, "unknown error", false, false};
  try {
    throw;
  } catch (const EngineError& e) {
    failure.route = e.route();
    failure.unreachable = e.unreachable();
    failure.message = without_peer_suffix(e.what(), engine);
  } catch (const comm::TimeoutError& e) {
    failure.timed_out = true;
    failure.message = e.what();
  } catch (const std::exception& e) {
    failure.message = e.what();
  }
  return failure;
}

std::vector<EngineFailure> on_all_engines(
    std::span<EngineApi* const> engines, const std::string& route,
    const std::function<void(EngineApi& engine, std::size_t index)>& call) {
  std::vector<std::future<void>> pending;
  pending.reserve(engines.size());
  for (std::size_t i = 0; i < engines.size(); ++i) {
    pending.push_back(
        std::async(std::launch::async, [&call, &engines, i] { call(*engines[i], i); }));
  }
  std::vector<EngineFailure> failures;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    try {
      pending[i].get();
    } catch (...) {
      failures.push_back(current_failure(engines[i]->url(), route));
    }
  }
  return failures;
}

namespace {
const EngineFailure& blamed(const std::vector<EngineFailure>& failures) {
  WC_ENFORCE(!failures.empty());
  return *blame(failures);
}
}  // namespace

EngineCallError::EngineCallError(const std::string& what, std::vector<EngineFailure> failures)
    : comm::PeerError(blamed(failures).engine, what + ": " + to_string(blamed(failures))),
      failures_(std::move(failures)) {}

void throw_if_failed(const std::string& what, std::vector<EngineFailure> failures) {
  if (!failures.empty()) throw EngineCallError(what, std::move(failures));
}

}  // namespace weightcast::sync::trainer

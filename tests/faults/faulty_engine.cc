#include "tests/faults/faulty_engine.h"

#include "tests/faults/fault_support.h"

namespace weightcast::faults {

using sync::trainer::EngineError;

FaultyEngine::FaultyEngine(std::unique_ptr<sync::trainer::EngineApi> inner)
    : inner_(std::move(inner)) {}

std::vector<CallRecord> FaultyEngine::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

template <typename Fn>
auto FaultyEngine::run(const std::string& route, Fn&& fn) -> decltype(fn()) {
  CallRecord record{route, std::chrono::steady_clock::now(), {}, true, "", ""};
  auto finish = [&](const char* type, const std::exception& e) {
    record.end = std::chrono::steady_clock::now();
    record.ok = false;
    record.error_type = type;
    record.error = e.what();
    std::lock_guard lock(mu_);
    calls_.push_back(record);
  };
  try {
    if (before) before(route);
    auto result = fn();
    record.end = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    calls_.push_back(record);
    return result;
  } catch (const EngineError& e) {
    const std::string type = "EngineError " + std::to_string(e.status());
    finish(type.c_str(), e);
    throw;
  } catch (const comm::TimeoutError& e) {
    finish("TimeoutError", e);
    throw;
  } catch (const comm::PeerError& e) {
    finish("PeerError", e);
    throw;
  } catch (const std::exception& e) {
    finish("other", e);
    throw;
  }
}

sync::BasicResponse FaultyEngine::health() {
  return run("GET /health", [&] { return inner_->health(); });
}
sync::ServerInfoResponse FaultyEngine::server_info() {
  return run("GET /server_info", [&] { return inner_->server_info(); });
}
sync::BasicResponse FaultyEngine::init_weights_update_group(
    const sync::InitWeightsUpdateGroupRequest& req) {
  sync::InitWeightsUpdateGroupRequest sent = req;
  if (rewrite_init) rewrite_init(sent);
  return run("POST /init_weights_update_group",
             [&] { return inner_->init_weights_update_group(sent); });
}
sync::BasicResponse FaultyEngine::destroy_weights_update_group(
    const sync::DestroyWeightsUpdateGroupRequest& req) {
  return run("POST /destroy_weights_update_group",
             [&] { return inner_->destroy_weights_update_group(req); });
}
sync::BasicResponse FaultyEngine::pause_generation(const sync::PauseGenerationRequest& req) {
  return run("POST /pause_generation", [&] { return inner_->pause_generation(req); });
}
sync::BasicResponse FaultyEngine::flush_cache() {
  return run("POST /flush_cache", [&] { return inner_->flush_cache(); });
}
sync::BeginWeightUpdateResponse FaultyEngine::begin_weight_update(
    const sync::BeginWeightUpdateRequest& req) {
  return run("POST /begin_weight_update", [&] { return inner_->begin_weight_update(req); });
}
sync::BasicResponse FaultyEngine::update_weights_from_distributed(
    const sync::UpdateWeightsFromDistributedRequest& req) {
  return run("POST /update_weights_from_distributed",
             [&] { return inner_->update_weights_from_distributed(req); });
}
sync::BasicResponse FaultyEngine::update_weight_version(
    const sync::UpdateWeightVersionRequest& req) {
  return run("POST /update_weight_version", [&] { return inner_->update_weight_version(req); });
}
sync::EndWeightUpdateResponse FaultyEngine::end_weight_update(
    const sync::EndWeightUpdateRequest& req) {
  return run("POST /end_weight_update", [&] { return inner_->end_weight_update(req); });
}
sync::BasicResponse FaultyEngine::continue_generation(const sync::ContinueGenerationRequest& req) {
  return run("POST /continue_generation", [&] { return inner_->continue_generation(req); });
}
sync::BasicResponse FaultyEngine::abort_weight_update(const sync::AbortWeightUpdateRequest& req) {
  return run("POST /abort_weight_update", [&] { return inner_->abort_weight_update(req); });
}
sync::BasicResponse FaultyEngine::release_lease(const sync::ReleaseLeaseRequest& req) {
  return run("POST /release_weight_update_lease", [&] { return inner_->release_lease(req); });
}
sync::BasicResponse FaultyEngine::update_weights_from_disk(const std::string& model_path) {
  return run("POST /update_weights_from_disk",
             [&] { return inner_->update_weights_from_disk(model_path); });
}
sync::WeightsChecksumResponse FaultyEngine::weights_checksum(sync::Runner runner, bool recompute) {
  return run("GET /weights_checksum", [&] { return inner_->weights_checksum(runner, recompute); });
}
std::string FaultyEngine::metrics() {
  return run("GET /metrics", [&] { return inner_->metrics(); });
}
sync::SpecAcceptLengthResponse FaultyEngine::spec_accept_length() {
  return run("GET /spec_accept_length", [&] { return inner_->spec_accept_length(); });
}

FaultyClients faulty_clients(const std::vector<std::string>& urls,
                             const sync::trainer::UpdaterOptions& options) {
  FaultyClients out;
  for (const auto& url : urls) {
    auto f = std::make_unique<FaultyEngine>(engine_client(url, options));
    out.faulty.push_back(f.get());
    out.apis.push_back(std::move(f));
  }
  return out;
}

}  // namespace weightcast::faults

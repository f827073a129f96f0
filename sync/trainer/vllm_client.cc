#include "sync/trainer/vllm_client.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "comm/errors.h"
#include "sync/trainer/server_info_answers.h"
#include "sync/trainer/sglang_answers.h"

namespace weightcast::sync::trainer {

namespace {

using Json = nlohmann::json;

// The backend's name in --weight-transfer-config (python/weightcast/vllm.py BACKEND).
constexpr std::string_view kBackend = "weightcast";

Json object_of(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw comm::BadRequestError("vLLM answer is not a JSON object");
  }
  return j;
}

const Json* member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

std::string vllm_init_body(const InitWeightsUpdateGroupRequest& req) {
  return Json{{"init_info", object_of(to_json_string(req))}}.dump();
}

std::string vllm_start_route(Selector selector) {
  return selector == Selector::kDraft ? "/start_draft_weight_update" : "/start_weight_update";
}

std::string vllm_start_body(Selector selector) {
  // vLLM reads is_checkpoint_format (true: the names are the checkpoint's, as ours are) where it
  // reads a body at all; the selector is ours (the backend also takes it from each bucket).
  return Json{{"is_checkpoint_format", true}, {"selector", std::string(to_string(selector))}}
      .dump();
}

std::string vllm_update_body(const UpdateWeightsFromDistributedRequest& req) {
  Json info = object_of(to_json_string(req));
  info.erase("session_id");
  return Json{{"update_info", std::move(info)}}.dump();
}

std::string vllm_abort_body(const std::string& reason) {
  return Json{{"update_info", {{"abort", true}, {"reason", reason}}}}.dump();
}

std::string vllm_finish_body(const std::string& weight_version) {
  return Json{{"weight_version", weight_version}}.dump();
}

std::string vllm_pause_route(PauseMode mode) {
  switch (mode) {
    case PauseMode::kAbort:
      return "/pause?mode=abort";
    case PauseMode::kRetract:
      return "/pause?mode=wait";
    case PauseMode::kInPlace:
      return "/pause?mode=keep";
  }
  return "/pause?mode=abort";
}

ServerInfoResponse read_vllm_server_info(std::string_view body, int world_size) {
  const Json j = object_of(body);
  const Json* config = member(j, "vllm_config");
  if (config == nullptr) throw comm::BadRequestError("/server_info: no vllm_config");
  ServerInfoResponse info;
  info.message = "vllm";
  info.version = "vllm";
  if (const Json* transfer = member(*config, "weight_transfer_config")) {
    const Json* backend = member(*transfer, "backend");
    if (backend != nullptr && backend->is_string() && backend->get<std::string>() != kBackend) {
      throw comm::ConfigError("vLLM runs weight-transfer backend '" + backend->get<std::string>() +
                              "'; start it with --weight-transfer-config '{\"backend\": \"" +
                              std::string(kBackend) + "\"}' (python/weightcast/vllm.py)");
    }
  }
  if (world_size < 1 || world_size > 1 << 20) {
    throw comm::BadRequestError("/get_world_size: world_size must be a positive integer");
  }
  info.rank_count = world_size;
  info.tp_size = world_size;
  if (const Json* parallel = member(*config, "parallel_config")) {
    const Json* tp = member(*parallel, "tensor_parallel_size");
    if (tp != nullptr && tp->is_number_integer() && tp->get<std::int64_t>() != world_size) {
      // Each worker joins as its TP rank (python/weightcast/vllm.py): PP or DP workers would
      // collide on ranks, so only TP-only engines are driven.
      throw comm::ConfigError("vLLM world size " + std::to_string(world_size) +
                              " is not its tensor_parallel_size " + tp->dump() +
                              ": the weightcast backend receives on TP-only engines (PP = DP = 1)");
    }
  }
  if (const Json* spec = member(*config, "speculative_config")) {
    if (const Json* method = member(*spec, "method"); method != nullptr && method->is_string()) {
      info.speculative_algorithm = method->get<std::string>();
    }
  }
  info.selectors.assign(kAllSelectors.begin(), kAllSelectors.end());
  info.backends.assign(kAllBackends.begin(), kAllBackends.end());
  if (const auto announce = read_receiver_announce(body, ProtocolLimits{})) {
    info.version = announce->version;
    info.runners = announce->runners;
  }
  return info;
}

std::optional<std::string> read_vllm_detail(std::string_view body) {
  const Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  const Json* detail = j.is_discarded() ? nullptr : member(j, "detail");
  if (detail == nullptr) return std::nullopt;
  constexpr std::size_t kMaxDetail = 1024;
  std::string text = detail->is_string() ? detail->get<std::string>() : detail->dump();
  if (text.size() > kMaxDetail) text.resize(kMaxDetail);
  return text;
}

VllmDialect::VllmDialect(std::string url, comm::Millis request_timeout, comm::Millis data_timeout,
                         Call call)
    : url_(std::move(url)),
      request_timeout_(request_timeout),
      data_timeout_(data_timeout),
      call_(std::move(call)) {}

BasicResponse VllmDialect::post(const std::string& route, const std::string& body,
                                comm::Millis timeout) {
  return read_sglang_answer(call_("POST", route, body, timeout));
}

ServerInfoResponse VllmDialect::server_info(std::string_view first_answer) {
  std::string body(first_answer);
  const Json first = object_of(body);
  if (const Json* config = member(first, "vllm_config"); config && config->is_string()) {
    body = call_("GET", "/server_info?config_format=json", "", request_timeout_);
  }
  const Json size = object_of(call_("GET", "/get_world_size", "", request_timeout_));
  const Json* world = member(size, "world_size");
  auto info = read_vllm_server_info(
      body, world != nullptr && world->is_number_integer() ? world->get<int>() : 0);
  info.weight_version = weight_version("default");
  return info;
}

BasicResponse VllmDialect::health() {
  return read_sglang_answer(call_("GET", "/health", "", request_timeout_));
}

BasicResponse VllmDialect::init(const InitWeightsUpdateGroupRequest& req) {
  return post("/init_weight_transfer_engine", vllm_init_body(req), data_timeout_);
}

BasicResponse VllmDialect::destroy(const DestroyWeightsUpdateGroupRequest& req) {
  // The backend's shutdown() leaves every group when the engine exits; a new group (another
  // name) can be joined beside an old one.
  return {true, "vLLM serves no route to leave group '" + req.group_name + "'"};
}

BasicResponse VllmDialect::pause(const PauseGenerationRequest& req) {
  return post(vllm_pause_route(req.mode), "", request_timeout_);
}

BasicResponse VllmDialect::resume() {
  return post("/resume", "", request_timeout_);
}

BasicResponse VllmDialect::flush_cache() {
  return post("/reset_prefix_cache", "", request_timeout_);
}

BeginWeightUpdateResponse VllmDialect::begin(const BeginWeightUpdateRequest& req) {
  BeginWeightUpdateResponse out;
  out.message =
      post(vllm_start_route(req.selector), vllm_start_body(req.selector), request_timeout_).message;
  out.selector = req.selector;
  // vLLM runs one update at a time and names none; the updater aborts sessions it holds an id
  // of, so the session gets one here (never sent: vllm_update_body drops it).
  out.session_id = "vllm";
  {
    std::lock_guard lock(mu_);
    pending_version_.clear();
  }
  return out;
}

BasicResponse VllmDialect::update(const UpdateWeightsFromDistributedRequest& req) {
  return post("/update_weights", vllm_update_body(req), data_timeout_);
}

BasicResponse VllmDialect::set_version(const UpdateWeightVersionRequest& req) {
  std::lock_guard lock(mu_);
  pending_version_ = req.new_version;
  return {true, "weight_version '" + req.new_version + "' is sent with /finish_weight_update"};
}

EndWeightUpdateResponse VllmDialect::end(const EndWeightUpdateRequest&) {
  std::string version;
  {
    std::lock_guard lock(mu_);
    version = std::exchange(pending_version_, {});
  }
  EndWeightUpdateResponse out;
  out.message = post("/finish_weight_update", vllm_finish_body(version), data_timeout_).message;
  out.weight_version = weight_version(version);
  return out;
}

BasicResponse VllmDialect::abort(const AbortWeightUpdateRequest&) {
  return post("/update_weights", vllm_abort_body("aborted by the trainer"), request_timeout_);
}

std::string VllmDialect::weight_version(const std::string& fallback) {
  std::string body;
  try {
    body = call_("GET", "/weight_info", "", request_timeout_);
  } catch (const EngineError& e) {
    if (e.status() != 404) throw;
    return fallback;
  }
  auto version = read_sglang_weight_version(body);
  if (!version) throw EngineError(url_, "GET /weight_info", 200, "no weight_version in the answer");
  return *version;
}

}  // namespace weightcast::sync::trainer

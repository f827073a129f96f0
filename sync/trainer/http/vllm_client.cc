#include "sync/trainer/http/vllm_client.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "comm/errors.h"
#include "sync/trainer/http/server_info_answers.h"
#include "sync/trainer/http/sglang_answers.h"

namespace weightcast::sync::trainer {

namespace {

using Json = nlohmann::json;

// The backend's name in --weight-transfer-config (python/weightcast/vllm.py BACKEND).
constexpr std::string_view kBackend = "weightcast";
// The worker extension's class for --worker-extension-cls (python/weightcast/vllm.py).
constexpr std::string_view kExtension = "weightcast.vllm.WeightcastWorkerExtension";

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

// The first message a worker answered ("" when none did).
std::string first_message(const std::vector<Json>& results) {
  for (const Json& r : results) {
    if (const Json* m = member(r, "message"); m != nullptr && m->is_string() && !m->empty()) {
      return m->get<std::string>();
    }
  }
  return "";
}

// The string every worker answered under `key`; empty when one answered none or another.
std::string common_text(const std::vector<Json>& results, const char* key) {
  std::string out;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Json* value = member(results[i], key);
    if (value == nullptr || !value->is_string()) return "";
    if (i == 0) {
      out = value->get<std::string>();
    } else if (value->get<std::string>() != out) {
      return "";
    }
  }
  return out;
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
  // vLLM records whatever string it gets, "" included: send none rather than an empty one.
  if (weight_version.empty()) return "{}";
  return Json{{"weight_version", weight_version}}.dump();
}

VllmWayIn read_vllm_way_in(std::string_view body) {
  const Json j = object_of(body);
  const Json* config = member(j, "vllm_config");
  if (config == nullptr) throw comm::BadRequestError("/server_info: no vllm_config");
  std::string backend;
  if (const Json* transfer = member(*config, "weight_transfer_config")) {
    if (const Json* name = member(*transfer, "backend"); name != nullptr && name->is_string()) {
      backend = name->get<std::string>();
    }
  }
  if (backend == kBackend) return VllmWayIn::kBackend;
  if (const Json* parallel = member(*config, "parallel_config")) {
    const Json* ext = member(*parallel, "worker_extension_cls");
    if (ext != nullptr && ext->is_string() && ext->get<std::string>() == kExtension) {
      return VllmWayIn::kWorkerExtension;
    }
  }
  if (backend.empty()) return VllmWayIn::kBackend;  // no weight-transfer config shown
  throw comm::ConfigError("vLLM runs weight-transfer backend '" + backend +
                          "'; start it with --weight-transfer-config '{\"backend\": \"" +
                          std::string(kBackend) + "\"}' (vLLM >= 0.25) or --worker-extension-cls " +
                          std::string(kExtension) + " (python/weightcast/vllm.py)");
}

std::vector<std::string> read_vllm_shard_plans(const std::vector<nlohmann::json>& answers,
                                               int rank_count) {
  if (rank_count < 1 || answers.size() != static_cast<std::size_t>(rank_count)) return {};
  std::vector<std::string> out(answers.size());
  for (const Json& a : answers) {
    const Json* plan = member(a, "plan");
    const Json* rank = member(a, "engine_rank");
    if (plan == nullptr || !plan->is_object() || rank == nullptr || !rank->is_number_integer()) {
      return {};
    }
    const auto r = rank->get<std::int64_t>();
    if (r < 0 || r >= rank_count || !out[static_cast<std::size_t>(r)].empty()) return {};
    out[static_cast<std::size_t>(r)] = plan->dump();
  }
  return out;
}

std::string vllm_load_lora_body(const std::string& lora_name, const std::string& path) {
  return Json{{"lora_name", lora_name}, {"lora_path", path}, {"load_inplace", true}}.dump();
}

bool read_vllm_lora_enabled(std::string_view body) {
  const Json j = object_of(body);
  const Json* config = member(j, "vllm_config");
  const Json* lora = config != nullptr ? member(*config, "lora_config") : nullptr;
  return lora != nullptr && !lora->is_null();
}

std::string vllm_rpc_body(const std::string& method, const std::vector<std::string>& args,
                          comm::Millis timeout) {
  return Json{{"method", method},
              {"args", args},
              {"timeout", static_cast<double>(timeout.count()) / 1000.0}}
      .dump();
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
  read_vllm_way_in(body);  // refuses an engine neither way reaches
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
  way_in_ = read_vllm_way_in(body);
  if (way_in_ == VllmWayIn::kWorkerExtension) info.message = "vllm (worker extension)";
  info.lora = way_in_ == VllmWayIn::kWorkerExtension && read_vllm_lora_enabled(body);
  if (way_in_ == VllmWayIn::kWorkerExtension) info.shard_plans = shard_plans(info.rank_count);
  info.weight_version = weight_version("default");
  return info;
}

std::vector<std::string> VllmDialect::shard_plans(int rank_count) {
  std::vector<Json> answers;
  try {
    answers = rpc_succeeded("weightcast_shard_plan", {}, data_timeout_);
  } catch (const comm::Error&) {
    return {};  // an extension without plans (older), or a worker that failed to answer
  }
  return read_vllm_shard_plans(answers, rank_count);
}

BasicResponse VllmDialect::health() {
  return read_sglang_answer(call_("GET", "/health", "", request_timeout_));
}

BasicResponse VllmDialect::init(const InitWeightsUpdateGroupRequest& req) {
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    return rpc_answer("weightcast_init", {to_json_string(req)}, data_timeout_);
  }
  return post("/init_weight_transfer_engine", vllm_init_body(req), data_timeout_);
}

BasicResponse VllmDialect::destroy(const DestroyWeightsUpdateGroupRequest& req) {
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    return rpc_answer("weightcast_destroy", {req.group_name}, request_timeout_);
  }
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
  if (req.lora && way_in_ != VllmWayIn::kWorkerExtension) {
    throw EngineError(url_, "POST /start_weight_update", 0,
                      "adapter updates need the worker extension (--worker-extension-cls " +
                          std::string(kExtension) + "); vLLM's weight-transfer API has none");
  }
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    std::vector<std::string> args{std::string(to_string(req.selector))};
    if (req.lora) args.push_back(Json::parse(to_json_string(req))["lora"].dump());
    const auto results = rpc_succeeded("weightcast_begin", args, request_timeout_);
    out.message = first_message(results);
    // The adapter every worker's receiver holds under the name: the base of the adapter's deltas.
    out.lora_version = common_text(results, "lora_version");
    out.lora_digest = common_text(results, "lora_digest");
    if (out.lora_version.empty() || out.lora_digest.empty())
      out.lora_version = out.lora_digest = "";
  } else {
    out.message =
        post(vllm_start_route(req.selector), vllm_start_body(req.selector), request_timeout_)
            .message;
  }
  out.selector = req.selector;
  // An adapter commit leaves the base weights' version, which the trainer checks it against.
  if (req.lora) out.weight_version = weight_version("default");
  // vLLM runs one update at a time and names none; the updater aborts sessions it holds an id
  // of, so the session gets one here (never sent: vllm_update_body drops it).
  out.session_id = "vllm";
  {
    std::lock_guard lock(mu_);
    pending_version_.clear();
    pending_lora_ = req.lora ? std::optional<std::string>(req.lora->name) : std::nullopt;
  }
  return out;
}

BasicResponse VllmDialect::update(const UpdateWeightsFromDistributedRequest& req) {
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    return rpc_answer("weightcast_update",
                      {Json::parse(vllm_update_body(req))["update_info"].dump()}, data_timeout_);
  }
  return post("/update_weights", vllm_update_body(req), data_timeout_);
}

BasicResponse VllmDialect::set_version(const UpdateWeightVersionRequest& req) {
  std::lock_guard lock(mu_);
  pending_version_ = req.new_version;
  return {true, "weight_version '" + req.new_version + "' is sent with /finish_weight_update"};
}

EndWeightUpdateResponse VllmDialect::end(const EndWeightUpdateRequest&) {
  std::string version;
  std::optional<std::string> lora;
  {
    std::lock_guard lock(mu_);
    version = std::exchange(pending_version_, {});
    lora = std::exchange(pending_lora_, std::nullopt);
  }
  EndWeightUpdateResponse out;
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    std::vector<std::string> args;
    if (!version.empty()) args.push_back(version);
    if (lora) {
      commit_adapter(*lora, args, out);
    } else {
      out.message = rpc_answer("weightcast_commit", args, data_timeout_).message;
    }
  } else {
    out.message = post("/finish_weight_update", vllm_finish_body(version), data_timeout_).message;
  }
  out.weight_version = weight_version(version);
  return out;
}

BasicResponse VllmDialect::abort(const AbortWeightUpdateRequest&) {
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    return rpc_answer("weightcast_abort", {"aborted by the trainer"}, request_timeout_);
  }
  try {
    return post("/update_weights", vllm_abort_body("aborted by the trainer"), request_timeout_);
  } catch (const EngineError& e) {
    // vLLM's worker leaves its update only when the backend raises, so the backend answers an
    // abort by raising; a worker a failure already took out of its update refuses the update
    // outright. Either way no update is open any more. An engine that did not answer did not.
    if (e.unreachable()) throw;
    return {true, std::string("update ended: ") + e.what()};
  }
}

std::vector<std::string> VllmDialect::rpc(const std::string& method,
                                          const std::vector<std::string>& args,
                                          comm::Millis timeout) {
  const Json answer =
      object_of(call_("POST", "/collective_rpc", vllm_rpc_body(method, args, timeout), timeout));
  const Json* results = member(answer, "results");
  if (results == nullptr || !results->is_array() || results->empty()) {
    throw EngineError(url_, "POST /collective_rpc " + method, 200, "no results in the answer");
  }
  std::vector<std::string> out;
  for (const Json& r : *results) {
    if (!r.is_object()) {
      throw EngineError(url_, "POST /collective_rpc " + method, 200,
                        "a worker answered " + r.dump() + " (is " + std::string(kExtension) +
                            " the worker extension?)");
    }
    out.push_back(r.dump());
  }
  return out;
}

std::vector<Json> VllmDialect::rpc_succeeded(const std::string& method,
                                             const std::vector<std::string>& args,
                                             comm::Millis timeout) {
  std::vector<Json> out;
  for (const auto& a : rpc(method, args, timeout)) {
    Json r = object_of(a);
    if (const Json* ok = member(r, "success"); ok != nullptr && *ok == false) {
      const Json* message = member(r, "message");
      throw EngineError(
          url_, "POST /collective_rpc " + method, 200,
          message != nullptr && message->is_string() ? message->get<std::string>() : r.dump());
    }
    out.push_back(std::move(r));
  }
  return out;
}

BasicResponse VllmDialect::rpc_answer(const std::string& method,
                                      const std::vector<std::string>& args, comm::Millis timeout) {
  return {true, first_message(rpc_succeeded(method, args, timeout))};
}

void VllmDialect::commit_adapter(const std::string& lora_name, const std::vector<std::string>& args,
                                 EndWeightUpdateResponse& out) {
  std::string path;
  const auto results = rpc_succeeded("weightcast_commit", args, data_timeout_);
  for (const Json& r : results) {
    const Json* p = member(r, "lora_path");
    if (p != nullptr && p->is_string() && path.empty()) path = p->get<std::string>();
  }
  out.lora_digest = common_text(results, "lora_digest");
  if (path.empty()) {
    throw EngineError(url_, "POST /collective_rpc weightcast_commit", 200,
                      "no worker answered the committed adapter's lora_path");
  }
  const std::string route = "/v1/load_lora_adapter";
  try {
    call_("POST", route, vllm_load_lora_body(lora_name, path), data_timeout_);
  } catch (const EngineError& e) {
    if (e.status() != 404) throw;
    throw EngineError(url_, "POST " + route, 404,
                      "vLLM serves no run-time LoRA loading: start it with --enable-lora and "
                      "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True");
  }
  out.message = "adapter '" + lora_name + "' committed and loaded by vLLM from " + path;
}

WeightsChecksumResponse VllmDialect::adapter_checksum(const std::string& lora_name) {
  const std::string what = "POST /collective_rpc weightcast_adapter_checksum";
  std::optional<std::string> agreed;
  for (const auto& a : rpc("weightcast_adapter_checksum", {lora_name}, request_timeout_)) {
    if (agreed && *agreed != a) {
      throw EngineError(url_, what, 200,
                        "the workers do not hold the same adapter '" + lora_name + "'");
    }
    agreed = a;
  }
  auto answer = parse_weights_checksum_response(*agreed, ProtocolLimits{});
  if (!answer.success) throw EngineError(url_, what, 200, answer.message);
  return answer;
}

std::string VllmDialect::weight_version(const std::string& fallback) {
  if (way_in_ == VllmWayIn::kWorkerExtension) {
    std::optional<std::string> agreed;
    for (const auto& a : rpc("weightcast_version", {}, request_timeout_)) {
      auto v = read_sglang_weight_version(a);
      if (!v || (agreed && *agreed != *v)) {
        throw EngineError(url_, "POST /collective_rpc weightcast_version", 200,
                          "the workers do not agree on one weight_version");
      }
      agreed = v;
    }
    return *agreed;
  }
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

#include "sync/trainer/http/engine_client.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string_view>

#include "comm/enum_names.h"
#include "sync/model/lora.h"
#include "sync/protocol/protocol_text.h"
#include "sync/trainer/http/connection_pool.h"
#include "sync/trainer/http/server_info_answers.h"
#include "sync/trainer/http/sglang_answers.h"
#include "sync/trainer/http/vllm_client.h"

namespace weightcast::sync::trainer {

namespace {

std::string describe(int status, const std::string& message) {
  std::string text = status == 0 ? std::string("no answer") : "HTTP " + std::to_string(status);
  if (!message.empty()) text += ": " + message;
  return text;
}

// The engine's own message from an error body, or the body itself (quoted, bounded) when it is
// not a protocol response.
std::string engine_message(const std::string& body, const ProtocolLimits& limits) {
  if (body.empty()) return {};
  try {
    return parse_basic_response(body, limits).message;
  } catch (const comm::Error&) {
    if (auto detail = read_vllm_detail(body)) return *detail;  // FastAPI's failures (vLLM)
    return "unparsed answer " + quoted(body);
  }
}

// httplib's error names, said the way an operator reads them.
std::string transport_error(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "cannot connect (refused or unreachable)";
    case httplib::Error::Read:
      return "connection closed before the answer";
    case httplib::Error::Write:
      return "connection closed while sending the request";
    default:
      return httplib::to_string(error);
  }
}

constexpr auto kFlavors =
    comm::enum_names<EngineFlavor>("engine flavor", {{EngineFlavor::kWeightcast, "weightcast"},
                                                     {EngineFlavor::kSglang, "sglang"},
                                                     {EngineFlavor::kVllm, "vllm"}});

std::string normalize_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const auto scheme = url.find("://");
  if (scheme == std::string::npos || scheme == 0 || scheme + 3 >= url.size()) {
    throw comm::ConfigError("engine URL " + quoted(url) +
                            ": expected scheme://host:port, e.g. http://127.0.0.1:30000");
  }
  return url;
}

}  // namespace

std::string_view to_string(EngineFlavor flavor) {
  return kFlavors.name(flavor);
}

EngineFlavor parse_engine_flavor(std::string_view text) {
  return parse_name<comm::ConfigError>(kFlavors, text);
}

EngineError::EngineError(std::string engine, std::string route, int status,
                         const std::string& message)
    : comm::PeerError(engine, "engine " + engine + " " + route + ": " + describe(status, message)),
      route_(std::move(route)),
      status_(status) {}

BasicResponse EngineApi::update_weights_from_tensor(const UpdateWeightsFromTensorRequest&) {
  throw EngineError(url(), "POST /update_weights_from_tensor", 404,
                    "this engine (" + std::string(to_string(flavor())) +
                        ") takes no colocated buckets in weightcast's segment form");
}

EngineClient::EngineClient(std::string url, EngineClientOptions options)
    : url_(normalize_url(std::move(url))),
      options_(std::move(options)),
      connections_(std::make_unique<ConnectionPool>(
          url_, options_.keep_alive ? options_.keep_alive_idle : comm::Millis(0))),
      sglang_(options_.flavor == EngineFlavor::kSglang),
      vllm_on_(options_.flavor == EngineFlavor::kVllm),
      vllm_(std::make_unique<VllmDialect>(
          url_, options_.request_timeout, options_.data_timeout,
          [this](std::string_view method, const std::string& route, const std::string& body,
                 comm::Millis read_timeout) { return call(method, route, body, read_timeout); })) {}

EngineClient::~EngineClient() = default;

void EngineClient::close_idle_connections() {
  connections_->close_idle();
}

std::string EngineClient::call(std::string_view method, const std::string& route,
                               const std::string& body, comm::Millis read_timeout) const {
  const std::string what = std::string(method) + " " + route;
  ConnectionPool::Lease lease = connections_->acquire();
  httplib::Client& client = lease.client();
  client.set_connection_timeout(options_.connect_timeout);
  client.set_read_timeout(read_timeout);
  client.set_write_timeout(options_.request_timeout);
  if (!options_.token.empty()) client.set_bearer_token_auth(options_.token);

  httplib::Request request;
  request.method = std::string(method);
  request.path = route;
  if (method == "POST") {
    request.body = body;
    request.set_header("Content-Type", "application/json");
  }
  // Bound the answer before it is buffered: an engine that misbehaves cannot make us allocate.
  std::string answer;
  bool too_large = false;
  const std::size_t max_body = options_.limits.max_body_bytes;
  request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    if (answer.size() + size > max_body) {
      too_large = true;
      return false;
    }
    answer.append(data, size);
    return true;
  };

  const auto start = std::chrono::steady_clock::now();
  httplib::Result result = client.send(request);
  if (!result) {
    if (too_large) {
      throw EngineError(url_, what, 0, "answer larger than " + std::to_string(max_body) + " bytes");
    }
    const auto waited =
        std::chrono::duration_cast<comm::Millis>(std::chrono::steady_clock::now() - start);
    const httplib::Error error = result.error();
    // httplib reports a read timeout as a read error; the elapsed time tells them apart from a
    // reset connection.
    if (error == httplib::Error::ConnectionTimeout ||
        (error == httplib::Error::Read && waited + comm::Millis(50) >= read_timeout)) {
      throw comm::TimeoutError("engine " + url_ + " " + what + ": no answer within " +
                               std::to_string(waited.count()) + " ms");
    }
    throw EngineError(url_, what, 0, transport_error(error));
  }
  const int status = result->status;
  if (status < 200 || status >= 300) {
    // An error answer may have come before the engine read the body (a refusal): the lease
    // closes the connection.
    throw EngineError(url_, what, status, engine_message(answer, options_.limits));
  }
  lease.keep();  // a whole 2xx answer: the connection may serve the next request
  return answer;
}

namespace {

// A 2xx answer that says success=false is a failure too.
template <typename Response>
Response checked(Response response, const std::string& url, const std::string& what) {
  if (!response.success) throw EngineError(url, what, 200, response.message);
  return response;
}

}  // namespace

BasicResponse EngineClient::basic(std::string_view method, const std::string& route,
                                  const std::string& body, comm::Millis read_timeout) const {
  return checked(parse_basic_response(call(method, route, body, read_timeout), options_.limits),
                 url_, std::string(method) + " " + route);
}

BasicResponse EngineClient::lenient(std::string_view method, const std::string& route,
                                    const std::string& body, comm::Millis read_timeout) const {
  return checked(read_sglang_answer(call(method, route, body, read_timeout)), url_,
                 std::string(method) + " " + route);
}

BasicResponse EngineClient::flavored(std::string_view method, const std::string& route,
                                     const std::string& body, comm::Millis read_timeout) const {
  if (sglang_) return lenient(method, route, body, read_timeout);
  return basic(method, route, body, read_timeout);
}

template <typename Request>
BasicResponse EngineClient::post(const std::string& route, const Request& req, Answer answer,
                                 comm::Millis read_timeout) const {
  const std::string body = to_json_string(req);
  if (answer == Answer::kFlavored) return flavored("POST", route, body, read_timeout);
  return basic("POST", route, body, read_timeout);
}

template <typename Response>
Response EngineClient::typed(Response (*parse)(std::string_view, const ProtocolLimits&),
                             std::string_view method, const std::string& route,
                             const std::string& body) const {
  return checked(parse(call(method, route, body, options_.request_timeout), options_.limits), url_,
                 std::string(method) + " " + route);
}

template <typename Response, typename Fill>
Response EngineClient::typed_post(Response (*parse)(std::string_view, const ProtocolLimits&),
                                  const std::string& route, const std::string& body,
                                  Fill sglang_fill) const {
  if (!sglang_) return typed(parse, "POST", route, body);
  Response out;
  out.message = lenient("POST", route, body, options_.request_timeout).message;
  sglang_fill(out);
  return out;
}

std::string EngineClient::sglang_weight_version() const {
  std::optional<std::string> version;
  try {
    version = read_sglang_weight_version(
        call("GET", "/get_weight_version", "", options_.request_timeout));
  } catch (const EngineError& e) {
    if (e.status() != 404) throw;
  }
  if (!version) {
    version = read_sglang_weight_version(call("GET", "/model_info", "", options_.request_timeout));
  }
  if (!version) {
    throw EngineError(url_, "GET /get_weight_version", 200,
                      "no weight_version in /get_weight_version nor /model_info");
  }
  return *version;
}

BasicResponse EngineClient::health() {
  if (vllm_on_) return vllm_->health();
  return flavored("GET", "/health", "", options_.request_timeout);
}

ServerInfoResponse EngineClient::server_info() {
  if (!sglang_) {
    std::string body;
    try {
      body = call("GET", "/server_info", "", options_.request_timeout);
    } catch (const EngineError& e) {
      // Only an engine that does not know the route is taken for an older SGLang; a forced
      // weightcast or vllm flavor never is.
      if (e.status() != 404 || options_.flavor) {
        if (e.status() == 404 && vllm_on_) {
          throw EngineError(url_, "GET /server_info", 404,
                            "vLLM serves its weight-transfer routes only in dev mode "
                            "(VLLM_SERVER_DEV_MODE=1)");
        }
        throw;
      }
    }
    if (!body.empty() || options_.flavor) {
      const EngineFlavor seen = options_.flavor.value_or(flavor_of_server_info(body));
      if (seen == EngineFlavor::kVllm) {
        vllm_on_ = true;
        return vllm_->server_info(body);
      }
      if (seen == EngineFlavor::kWeightcast) {
        return checked(parse_server_info_response(body, options_.limits), url_, "GET /server_info");
      }
      return sglang_info(body, "/server_info");  // SGLang's canonical route
    }
  }
  try {
    return sglang_info(call("GET", "/get_server_info", "", options_.request_timeout),
                       "/get_server_info");
  } catch (const EngineError& e) {
    if (e.status() != 404) throw;
    throw EngineError(url_, "GET /get_server_info", 404,
                      "neither /server_info nor /get_server_info is served (a vLLM server "
                      "serves them only in dev mode, VLLM_SERVER_DEV_MODE=1)");
  }
}

ServerInfoResponse EngineClient::sglang_info(const std::string& body, const std::string& route) {
  auto info = read_sglang_server_info(body, options_.limits);
  try {
    if (const auto announce = read_receiver_announce(body, options_.limits)) {
      info.message = "sglang with weightcast receiver " + announce->version;
    }
  } catch (const comm::BadRequestError& e) {
    throw EngineError(url_, "GET " + route, 200, e.what());
  }
  sglang_ = true;
  return info;
}

BasicResponse EngineClient::init_weights_update_group(const InitWeightsUpdateGroupRequest& req) {
  if (vllm_on_) return vllm_->init(req);
  return post("/init_weights_update_group", req, Answer::kStrict, options_.data_timeout);
}

BasicResponse EngineClient::destroy_weights_update_group(
    const DestroyWeightsUpdateGroupRequest& req) {
  if (vllm_on_) return vllm_->destroy(req);
  return post("/destroy_weights_update_group", req, Answer::kStrict, options_.request_timeout);
}

BasicResponse EngineClient::pause_generation(const PauseGenerationRequest& req) {
  if (vllm_on_) return vllm_->pause(req);
  return post("/pause_generation", req, Answer::kFlavored, options_.request_timeout);
}

BasicResponse EngineClient::flush_cache() {
  if (vllm_on_) return vllm_->flush_cache();
  // SGLang answers plain text, to GET as Miles sends it.
  if (sglang_) return lenient("GET", "/flush_cache", "", options_.request_timeout);
  return post("/flush_cache", FlushCacheRequest{}, Answer::kStrict, options_.request_timeout);
}

BeginWeightUpdateResponse EngineClient::begin_weight_update(const BeginWeightUpdateRequest& req) {
  if (vllm_on_) return vllm_->begin(req);
  if (sessionless_) {
    BeginWeightUpdateResponse out;
    out.message = "no session: this SGLang engine serves none (begin answered 404)";
    out.selector = req.selector;
    return out;
  }
  try {
    // SGLang does not echo the selector; the session has the one it was asked for.
    return typed_post(parse_begin_weight_update_response, "/begin_weight_update",
                      to_json_string(req), [&](auto& out) { out.selector = req.selector; });
  } catch (const EngineError& e) {
    // An SGLang build without the sessions branch (slime's): updates go without a session.
    if (!sglang_ || e.status() != 404) throw;
  }
  sessionless_ = true;
  return begin_weight_update(req);
}

BasicResponse EngineClient::update_weights_from_distributed(
    const UpdateWeightsFromDistributedRequest& req) {
  if (vllm_on_) return vllm_->update(req);
  return post("/update_weights_from_distributed", req, Answer::kFlavored, options_.data_timeout);
}

BasicResponse EngineClient::update_weights_from_tensor(const UpdateWeightsFromTensorRequest& req) {
  if (flavor() != EngineFlavor::kWeightcast) {
    return EngineApi::update_weights_from_tensor(req);  // weightcast's segment form only
  }
  return post("/update_weights_from_tensor", req, Answer::kStrict, options_.data_timeout);
}

BasicResponse EngineClient::update_weight_version(const UpdateWeightVersionRequest& req) {
  if (vllm_on_) return vllm_->set_version(req);
  return post("/update_weight_version", req, Answer::kFlavored, options_.request_timeout);
}

EndWeightUpdateResponse EngineClient::end_weight_update(const EndWeightUpdateRequest& req) {
  if (vllm_on_) return vllm_->end(req);
  if (sessionless_) {
    // Nothing to end: each bucket was applied with the version it carried; read it back.
    EndWeightUpdateResponse out;
    out.message = "no session to end";
    out.weight_version = sglang_weight_version();
    return out;
  }
  // No version or runner stats in SGLang's answer: the version is read back.
  return typed_post(parse_end_weight_update_response, "/end_weight_update", to_json_string(req),
                    [&](auto& out) { out.weight_version = sglang_weight_version(); });
}

BasicResponse EngineClient::continue_generation(const ContinueGenerationRequest& req) {
  if (vllm_on_) return vllm_->resume();
  return post("/continue_generation", req, Answer::kFlavored, options_.request_timeout);
}

BasicResponse EngineClient::abort_weight_update(const AbortWeightUpdateRequest& req) {
  if (vllm_on_) return vllm_->abort(req);
  if (sglang_) {
    throw EngineError(url_, "POST /abort_weight_update", 0,
                      "SGLang has no abort route: the engine needs a fresh group and a reload");
  }
  return post("/abort_weight_update", req, Answer::kStrict, options_.request_timeout);
}

BasicResponse EngineClient::release_lease(const ReleaseLeaseRequest& req) {
  if (vllm_on_) return {true, "vLLM engines hold no lease"};
  if (sglang_) return {true, "SGLang engines hold no lease"};
  return post("/release_weight_update_lease", req, Answer::kStrict, options_.request_timeout);
}

BasicResponse EngineClient::update_weights_from_disk(const std::string& model_path) {
  if (vllm_on_) {
    throw EngineError(url_, "POST /update_weights_from_disk", 0,
                      "not served by vLLM: restart the engine on the checkpoint");
  }
  const nlohmann::json body = {{"model_path", model_path}};
  return flavored("POST", "/update_weights_from_disk", body.dump(), options_.data_timeout);
}

WeightsChecksumResponse EngineClient::adapter_checksum(const std::string& lora_name) {
  validate_adapter_name(lora_name);
  const std::string route = "/weights_checksum?lora=" + lora_name;
  if (sglang_) throw EngineError(url_, "GET " + route, 0, "an SGLang engine serves no checksums");
  if (vllm_on_) return vllm_->adapter_checksum(lora_name);
  const std::string body = call("GET", route, "", options_.request_timeout);
  return checked(parse_weights_checksum_response(body, options_.limits), url_, "GET " + route);
}

WeightsChecksumResponse EngineClient::weights_checksum(Runner runner, bool recompute) {
  const std::string route = "/weights_checksum?runner=" + std::string(to_string(runner)) +
                            (recompute ? "&recompute=1" : "");
  if (sglang_) {
    throw EngineError(url_, "GET " + route, 0, "an SGLang engine serves no weight checksums");
  }
  const std::string body = call("GET", route, "", options_.request_timeout);
  auto answer =
      checked(parse_weights_checksum_response(body, options_.limits), url_, "GET " + route);
  if (recompute) {
    // An engine that ignored the parameter answered with its stored digests: not what was asked.
    const auto json = nlohmann::json::parse(body, nullptr, false);
    const auto it = json.is_object() ? json.find("recomputed") : json.end();
    if (!json.is_object() || it == json.end() || !it->is_boolean() || !it->get<bool>()) {
      throw EngineError(url_, "GET " + route, 200,
                        "the answer does not say it recomputed the digests (recomputed: true)");
    }
  }
  return answer;
}

std::string EngineClient::metrics() {
  return call("GET", "/metrics", "", options_.request_timeout);
}

SpecAcceptLengthResponse EngineClient::spec_accept_length() {
  return typed(parse_spec_accept_length_response, "GET", "/spec_accept_length");
}

}  // namespace weightcast::sync::trainer

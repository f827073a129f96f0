// EngineClient: the HTTP implementation of EngineApi, one per engine.
//
// Each call takes a keep-alive connection of its own from a ConnectionPool (one reused within an
// update, a new one otherwise) with explicit connect, read and write timeouts, so calls from
// several threads never queue behind each other (the bucket sender keeps several requests to
// one engine in flight) and no call waits without a bound. Routes that wait on the data plane
// (init_weights_update_group, update_weights_from_distributed) use data_timeout as their read
// timeout; every other route uses request_timeout. With a token, every request carries
// "Authorization: Bearer <token>".
// Lifetime: holds the URL, options and idle connections (closed with the client).
// Threading: all methods are safe to call concurrently.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/deadline.h"
#include "sync/protocol/protocol_limits.h"
#include "sync/trainer/http/connection_pool.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::sync::trainer {

class VllmDialect;     // sync/trainer/http/vllm_client.h

struct EngineClientOptions {
  std::string token;                    // bearer token; empty: none sent
  comm::Millis connect_timeout{5000};   // TCP connect
  comm::Millis request_timeout{60000};  // read/write of control routes
  comm::Millis data_timeout{300000};    // read of init and bucket routes
  ProtocolLimits limits;                // applied to every response body
  // Reuse a connection for the next request when it comes within 0.5 s (ConnectionPool);
  // false: a new connection for every request (for a proxy that mishandles keep-alive).
  bool keep_alive = true;
  // How long a kept connection may wait for its next request (ConnectionPool::kDefaultMaxIdle).
  comm::Millis keep_alive_idle = ConnectionPool::kDefaultMaxIdle;
  // Unset: detected by server_info() from the /server_info answer (sync/trainer/
  // server_info_answers.h: "vllm_config": vllm; ours, or a receiver announcing native routes:
  // weightcast; another object, or only /get_server_info answering: sglang).
  std::optional<EngineFlavor> flavor;
};

class EngineClient final : public EngineApi {
 public:
  // `url` is "http://host:port" (a trailing '/' is dropped). Throws comm::ConfigError for a URL
  // without scheme or host.
  EngineClient(std::string url, EngineClientOptions options);
  ~EngineClient() override;

  const std::string& url() const override { return url_; }
  EngineFlavor flavor() const override {
    if (vllm_on_) return EngineFlavor::kVllm;
    return sglang_ ? EngineFlavor::kSglang : EngineFlavor::kWeightcast;
  }
  bool sessions() const override { return !sessionless_; }
  void close_idle_connections() override;
  const EngineClientOptions& options() const { return options_; }

  BasicResponse health() override;
  ServerInfoResponse server_info() override;
  BasicResponse init_weights_update_group(const InitWeightsUpdateGroupRequest& req) override;
  BasicResponse destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& req) override;
  BasicResponse pause_generation(const PauseGenerationRequest& req) override;
  BasicResponse flush_cache() override;
  BeginWeightUpdateResponse begin_weight_update(const BeginWeightUpdateRequest& req) override;
  BasicResponse update_weights_from_distributed(
      const UpdateWeightsFromDistributedRequest& req) override;
  BasicResponse update_weights_from_tensor(const UpdateWeightsFromTensorRequest& req) override;
  BasicResponse update_weight_version(const UpdateWeightVersionRequest& req) override;
  EndWeightUpdateResponse end_weight_update(const EndWeightUpdateRequest& req) override;
  BasicResponse continue_generation(const ContinueGenerationRequest& req) override;
  BasicResponse abort_weight_update(const AbortWeightUpdateRequest& req) override;
  BasicResponse release_lease(const ReleaseLeaseRequest& req) override;
  BasicResponse update_weights_from_disk(const std::string& model_path) override;
  WeightsChecksumResponse weights_checksum(Runner runner, bool recompute = false) override;
  WeightsChecksumResponse adapter_checksum(const std::string& lora_name) override;
  std::string metrics() override;
  SpecAcceptLengthResponse spec_accept_length() override;

 private:
  // Sends one request ("GET" or "POST") and returns the 2xx body, or throws as EngineApi
  // describes.
  std::string call(std::string_view method, const std::string& route, const std::string& body,
                   comm::Millis read_timeout) const;
  // call() for routes answered with a BasicResponse; success=false throws EngineError.
  BasicResponse basic(std::string_view method, const std::string& route, const std::string& body,
                      comm::Millis read_timeout) const;

  // SGLang's answers: any 2xx is success unless a JSON body says "success": false.
  BasicResponse lenient(std::string_view method, const std::string& route, const std::string& body,
                        comm::Millis read_timeout) const;
  // Routes both flavors serve: lenient() for SGLang, basic() for weightcast.
  BasicResponse flavored(std::string_view method, const std::string& route, const std::string& body,
                         comm::Millis read_timeout) const;
  // How post() reads a route's BasicResponse: kStrict with basic() (weightcast's JSON, which
  // SGLang's init and destroy routes answer too), kFlavored with flavored().
  enum class Answer { kStrict, kFlavored };
  // The POST routes answered with a BasicResponse: `req` written with to_json_string(), the
  // answer read as `answer` says.
  template <typename Request>
  BasicResponse post(const std::string& route, const Request& req, Answer answer,
                     comm::Millis read_timeout) const;
  // call() (with request_timeout) for routes answered with a `Response` that `parse` reads;
  // success=false throws EngineError.
  template <typename Response>
  Response typed(Response (*parse)(std::string_view, const ProtocolLimits&),
                 std::string_view method, const std::string& route,
                 const std::string& body = "") const;
  // POST: typed() from weightcast; from SGLang, which answers with a message only, lenient() and
  // `sglang_fill(response)` completes the rest.
  template <typename Response, typename Fill>
  Response typed_post(Response (*parse)(std::string_view, const ProtocolLimits&),
                      const std::string& route, const std::string& body, Fill sglang_fill) const;
  // SGLang's committed version: /get_weight_version, else /model_info.
  std::string sglang_weight_version() const;
  // An SGLang /server_info or /get_server_info answer read (its receiver announce noted).
  ServerInfoResponse sglang_info(const std::string& body, const std::string& route);

  std::string url_;
  EngineClientOptions options_;
  std::unique_ptr<ConnectionPool> connections_;
  std::atomic<bool> sglang_{false};
  std::atomic<bool> sessionless_{false};  // an SGLang engine whose begin answered 404
  std::atomic<bool> vllm_on_{false};      // requests go through vllm_
  std::unique_ptr<VllmDialect> vllm_;
};

}  // namespace weightcast::sync::trainer

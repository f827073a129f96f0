// EngineApi: the trainer's view of one rollout engine, one method per route of the engine HTTP
// API. EngineClient (sync/trainer/http/engine_client.h) is the HTTP implementation; tests
// substitute in-process fakes so the updater's orchestration runs without sockets.
//
// Bodies are the shared schemas of sync/protocol/protocol.h, written and read with the same
// functions the engine uses. Every method either returns a success response or throws:
//   - EngineError (a comm::PeerError whose peer() is the engine URL) when the engine could not be
//     reached, dropped the connection, or answered non-2xx / success=false; the message names
//     the route and carries the engine's own message;
//   - comm::TimeoutError naming the engine and the route when an answer did not come in time;
//   - comm::BadRequestError when a 2xx answer does not fit the response schema.
// Lifetime: owned by the DistributedUpdater (or the caller). Threading: implementations must
// accept concurrent calls from several threads; the updater keeps several bucket requests to one
// engine in flight at once.
#pragma once

#include <string>
#include <string_view>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor_update.h"

namespace weightcast::sync::trainer {

// Which HTTP dialect an engine speaks. kWeightcast: weightcast-engine (strict JSON with
// "success", /server_info, /weights_checksum, /abort_weight_update, sequenced padded buckets,
// native groups). kSglang: an SGLang server (with the begin/end_weight_update routes Miles
// uses): SGLang's response shapes, /get_server_info, no abort, no checksum, torch groups.
// kVllm: a vLLM server in dev mode (VLLM_SERVER_DEV_MODE=1) running the `weightcast`
// weight-transfer backend (python/weightcast/vllm.py): vLLM's routes (/init_weight_transfer_engine,
// /start_weight_update, /update_weights, /finish_weight_update, /pause, /resume) carrying our
// bodies inside init_info / update_info, so the data plane is ours (native groups, our buckets);
// sync/trainer/http/vllm_client.h maps each call.
enum class EngineFlavor { kWeightcast, kSglang, kVllm };
std::string_view to_string(EngineFlavor flavor);
// "weightcast", "sglang" or "vllm"; comm::ConfigError otherwise.
EngineFlavor parse_engine_flavor(std::string_view text);

// A failed engine call. status() is the HTTP status, or 0 when no answer arrived at all (refused,
// reset, closed: the engine process is likely gone).
class EngineError : public comm::PeerError {
 public:
  EngineError(std::string engine, std::string route, int status, const std::string& message);
  const std::string& engine() const { return peer(); }
  const std::string& route() const { return route_; }
  int status() const { return status_; }
  bool unreachable() const { return status_ == 0; }

 private:
  std::string route_;
  int status_;
};

class EngineApi {
 public:
  virtual ~EngineApi() = default;

  // The engine's base URL ("http://host:port"); names it in every error and report.
  virtual const std::string& url() const = 0;
  // The engine's dialect; known once server_info() answered (before that: kWeightcast unless
  // forced).
  virtual EngineFlavor flavor() const { return EngineFlavor::kWeightcast; }
  // Whether the engine serves update sessions (begin/end_weight_update). False for SGLang builds
  // without them (slime-era; their begin answers 404): updates are then sessionless, each bucket
  // applied on its own (docs/protocol.md, "Sessionless updates").
  virtual bool sessions() const { return true; }
  // Closes the connections kept open for the next request (EngineClient's keep-alive): called
  // when an operation of the updater ends, so none stays open between updates.
  virtual void close_idle_connections() {}

  virtual BasicResponse health() = 0;
  virtual ServerInfoResponse server_info() = 0;
  virtual BasicResponse init_weights_update_group(const InitWeightsUpdateGroupRequest& req) = 0;
  virtual BasicResponse destroy_weights_update_group(
      const DestroyWeightsUpdateGroupRequest& req) = 0;
  virtual BasicResponse pause_generation(const PauseGenerationRequest& req) = 0;
  virtual BasicResponse flush_cache() = 0;
  virtual BeginWeightUpdateResponse begin_weight_update(const BeginWeightUpdateRequest& req) = 0;
  // Answers after the bucket was received on the data plane and staged (or failed).
  virtual BasicResponse update_weights_from_distributed(
      const UpdateWeightsFromDistributedRequest& req) = 0;
  // The colocated path (docs/colocated.md): a bucket in a shared segment the engine copies out
  // of; answers once staged. Engines without the route throw EngineError (status 404).
  virtual BasicResponse update_weights_from_tensor(const UpdateWeightsFromTensorRequest& req);
  virtual BasicResponse update_weight_version(const UpdateWeightVersionRequest& req) = 0;
  virtual EndWeightUpdateResponse end_weight_update(const EndWeightUpdateRequest& req) = 0;
  virtual BasicResponse continue_generation(const ContinueGenerationRequest& req) = 0;
  // Drops the open session and its staging (idempotent on the engine).
  virtual BasicResponse abort_weight_update(const AbortWeightUpdateRequest& req) = 0;
  // Ends this trainer's lease on the engine (sync/engine/control/lease.h); an engine without leases
  // (SGLang) answers that it holds none.
  virtual BasicResponse release_lease(const ReleaseLeaseRequest& req) = 0;
  // SGLang's POST /update_weights_from_disk {model_path}: reloads every weight from a checkpoint
  // (the recovery of an SGLang engine left holding part of a failed update).
  virtual BasicResponse update_weights_from_disk(const std::string& model_path) = 0;
  // The runner's stored digests, or with `recompute` the digests of the bytes the engine holds
  // now (/weights_checksum?recompute=1; an answer that does not say it recomputed is an error).
  virtual WeightsChecksumResponse weights_checksum(Runner runner, bool recompute = false) = 0;
  // The digests of the adapter held under `lora_name` (/weights_checksum?lora=NAME; docs/lora.md),
  // `weight_version` the adapter's. An engine that takes no adapters throws EngineError.
  virtual WeightsChecksumResponse adapter_checksum(const std::string& lora_name) {
    throw EngineError(url(), "GET /weights_checksum?lora=" + lora_name, 0,
                      "this engine serves no adapter checksums");
  }
  // Prometheus text.
  virtual std::string metrics() = 0;
  virtual SpecAcceptLengthResponse spec_accept_length() = 0;
};

}  // namespace weightcast::sync::trainer

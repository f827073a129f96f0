// The trainer's vLLM dialect: how EngineClient drives a vLLM server (dev mode,
// VLLM_SERVER_DEV_MODE=1) whose workers run the `weightcast` weight-transfer backend
// (python/weightcast/vllm.py, `--weight-transfer-config '{"backend": "weightcast"}'`).
//
// Our request bodies travel unchanged inside the backend-specific dicts vLLM forwards to every
// worker's WeightTransferEngine, so the data plane is ours (native groups, our buckets, digests):
//   init_weights_update_group  -> POST /init_weight_transfer_engine {"init_info": <init body>}
//   begin_weight_update        -> POST /start_weight_update {"selector", "is_checkpoint_format"}
//                                 (selector draft: POST /start_draft_weight_update)
//   update_weights_from_dist.  -> POST /update_weights {"update_info": <bucket body>}
//   update_weight_version      -> held here, sent with the finish
//   end_weight_update          -> POST /finish_weight_update {"weight_version"} (an empty body
//                                 when no version is pending: vLLM records whatever string it
//                                 gets, "" included), then the committed version read back from
//                                 GET /weight_info
//   abort_weight_update        -> POST /update_weights {"update_info": {"abort": true, "reason"}}
//                                 (vLLM has no abort route). The backend drops the staging and
//                                 raises, because vLLM's worker leaves its update state only when
//                                 the backend raises: the error answer is the abort's success
//                                 (so is "start_weight_update must be called before
//                                 update_weights", from a worker whose round a failure ended).
//   pause_generation           -> POST /pause?mode=abort|wait|keep; continue -> POST /resume
//   flush_cache                -> POST /reset_prefix_cache
//   server_info                -> GET /server_info (vllm_config), /get_world_size, /weight_info;
//                                 through the worker extension also the workers' shard plans
//                                 (weightcast_shard_plan, docs/sharding.md)
//   destroy_weights_update_group, release_lease: nothing to call (vLLM serves no such route).
// Worker extension (builds that cannot host the backend: `--worker-extension-cls
// weightcast.vllm.WeightcastWorkerExtension`, detected from parallel_config.worker_extension_cls):
// the same calls travel as POST /collective_rpc {"method": "weightcast_<call>", "args": [JSON
// text]} to every worker (init, begin, update, commit, abort, destroy, version); answers are
// {"results": [one dict per worker]}.
// Adapter sessions (docs/lora.md) go through the worker extension only: begin carries the "lora"
// object (weightcast_begin(selector, lora)), the commit writes the adapter as a PEFT directory
// on worker 0 and answers its path, and the trainer then loads it with vLLM's own run-time LoRA
// route, POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true} (served
// with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); the adapter checksum is
// weightcast_adapter_checksum(name). `lora_adapters` is announced only where vLLM runs with
// LoRA (vllm_config.lora_config) and the extension.
// Answers are vLLM's: any 2xx is success ({"message"} or {"status"}); failures are FastAPI's
// {"detail"} with the status.
// Lifetime: owned by one EngineClient, which it calls back for every request.
// Threading: all methods are safe to call concurrently.
#pragma once

#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/deadline.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::sync::trainer {

// The request bodies (pure; tested without a server).
std::string vllm_init_body(const InitWeightsUpdateGroupRequest& req);
std::string vllm_start_route(Selector selector);
std::string vllm_start_body(Selector selector);
// The bucket request without session_id (vLLM has one update at a time and no owners).
std::string vllm_update_body(const UpdateWeightsFromDistributedRequest& req);
std::string vllm_abort_body(const std::string& reason);
std::string vllm_finish_body(const std::string& weight_version);
// POST /v1/load_lora_adapter's body for an adapter the workers committed at `path`.
std::string vllm_load_lora_body(const std::string& lora_name, const std::string& path);
// Whether /server_info's vllm_config shows LoRA enabled (a non-null lora_config).
bool read_vllm_lora_enabled(std::string_view body);
// How the trainer reaches the workers: the weight-transfer backend or the worker extension.
enum class VllmWayIn { kBackend, kWorkerExtension };
// Read from /server_info's vllm_config: kBackend when weight_transfer_config.backend is
// `weightcast` (or no weight-transfer config is shown), kWorkerExtension when
// parallel_config.worker_extension_cls is weightcast's; comm::ConfigError naming both ways when
// the engine runs another backend without the extension.
VllmWayIn read_vllm_way_in(std::string_view body);
// POST /collective_rpc's body: `method` with its string arguments (vLLM passes strings only).
std::string vllm_rpc_body(const std::string& method, const std::vector<std::string>& args,
                          comm::Millis timeout);
// "/pause?mode=abort" (abort), "wait" (retract: running requests finish), "keep" (in_place).
std::string vllm_pause_route(PauseMode mode);
// What a trainer needs from vLLM's /server_info answer (`body`, its vllm_config as JSON or text)
// and /get_world_size: rank_count = tp_size = world_size (one receiver per worker), every
// selector and backend, speculative_algorithm from the speculative config, runners from a
// `weightcast` announce. comm::ConfigError when the config names another weight-transfer backend
// or a tensor_parallel_size other than the world size (PP or DP workers would share TP ranks).
ServerInfoResponse read_vllm_server_info(std::string_view body, int world_size);
// The shard plans of the workers' weightcast_shard_plan answers ({"plan", "engine_rank"}), rank
// r's at index r (docs/sharding.md); empty, so the engine receives whole tensors, unless there
// are `rank_count` answers, each with a plan object, one per rank.
std::vector<std::string> read_vllm_shard_plans(const std::vector<nlohmann::json>& answers,
                                               int rank_count);
// The "detail" text of a FastAPI error answer ({"detail": "..."}), if that is what `body` is.
std::optional<std::string> read_vllm_detail(std::string_view body);

class VllmDialect {
 public:
  using Call = std::function<std::string(std::string_view method, const std::string& route,
                                         const std::string& body, comm::Millis read_timeout)>;
  // `call` sends one request and returns the 2xx body (EngineClient::call).
  VllmDialect(std::string url, comm::Millis request_timeout, comm::Millis data_timeout, Call call);

  // `first_answer`: the /server_info body that showed the flavor.
  ServerInfoResponse server_info(std::string_view first_answer);
  BasicResponse health();
  BasicResponse init(const InitWeightsUpdateGroupRequest& req);
  BasicResponse destroy(const DestroyWeightsUpdateGroupRequest& req);
  BasicResponse pause(const PauseGenerationRequest& req);
  BasicResponse resume();
  BasicResponse flush_cache();
  BeginWeightUpdateResponse begin(const BeginWeightUpdateRequest& req);
  BasicResponse update(const UpdateWeightsFromDistributedRequest& req);
  BasicResponse set_version(const UpdateWeightVersionRequest& req);
  EndWeightUpdateResponse end(const EndWeightUpdateRequest& req);
  BasicResponse abort(const AbortWeightUpdateRequest& req);
  // GET /weight_info; `fallback` when the build serves no such route (404). Through the worker
  // extension: the workers' committed version (they must agree).
  std::string weight_version(const std::string& fallback);
  // An adapter's checksum through the worker extension (every worker must answer the same).
  WeightsChecksumResponse adapter_checksum(const std::string& lora_name);
  VllmWayIn way_in() const { return way_in_; }

 private:
  BasicResponse post(const std::string& route, const std::string& body, comm::Millis timeout);
  // One collective_rpc; returns the workers' answers (each a JSON object).
  std::vector<std::string> rpc(const std::string& method, const std::vector<std::string>& args,
                               comm::Millis timeout);
  // The workers' answers, EngineError naming the first that says success false.
  std::vector<nlohmann::json> rpc_succeeded(const std::string& method,
                                            const std::vector<std::string>& args,
                                            comm::Millis timeout);
  BasicResponse rpc_answer(const std::string& method, const std::vector<std::string>& args,
                           comm::Millis timeout);
  // The workers' shard plans through the extension (read_vllm_shard_plans); empty when the
  // extension records none (its loader could not be followed, or it predates plans).
  std::vector<std::string> shard_plans(int rank_count);
  // The adapter round's commit: the workers write it, vLLM loads it from there.
  void commit_adapter(const std::string& lora_name, const std::vector<std::string>& args,
                      EndWeightUpdateResponse& out);

  std::string url_;
  comm::Millis request_timeout_;
  comm::Millis data_timeout_;
  Call call_;
  std::mutex mu_;
  std::string pending_version_;              // from update_weight_version, sent with the finish
  std::optional<std::string> pending_lora_;  // the adapter the open round updates
  VllmWayIn way_in_ = VllmWayIn::kBackend;   // set by server_info()
};

}  // namespace weightcast::sync::trainer

// Engine: the rollout engine's weight-update logic behind the HTTP routes, without HTTP.
//
// The control plane over one Receiver (sync/engine/commit/receiver.h), which is the whole data
// plane and holds the one session state machine: the joined groups (one per trainer PP stage),
// sessions with their owners, staging, the digest and cross-rank checks and the commit's load
// into the runners. The Engine adds what a served engine needs around it, as small parts it owns:
//   SessionRoutes    begin/version/end/abort, leases, pause/continue/flush (session_routes.h)
//   BucketRoutes     groups and bucket requests, sessionless updates (bucket_routes.h)
//   EngineReaders    health, server info, checksums, metrics, the probe (engine_readers.h)
//   SessionWatchdog  idle sessions and pauses (session_watchdog.h)
// over one EngineContext they share (engine_context.h), and the two dialects' answers. Its runners
// (RunnerSet) are the Receiver's runners: their load keeps the staged blocks, and a commit becomes
// visible to readers in one publish after every load returned. Each public method is one route: it
// takes the parsed request body and returns the Reply the route sends, so the whole protocol is
// testable without sockets (give EngineOptions a fake GroupConnector). Refusals (409 state, 400
// input) change nothing. A failed, aborted or timed-out session discards its staging: the previous
// weights and weight_version stay. A watchdog thread aborts a session that sees no request for
// session_timeout while no bucket is in flight, and resumes generation left paused with no session
// and no request for as long (its trainer is gone). Lifetime: create with its runners, serve,
// destroy (which aborts groups and joins threads). Threading: every method is thread-safe;
// update_weights() blocks its caller until the bucket is received and staged (or failed), and
// several may wait at once, in any sequence order.
#pragma once

#include <memory>
#include <string>

#include "sync/engine/commit/receiver.h"
#include "sync/engine/control/bucket_routes.h"
#include "sync/engine/control/engine_context.h"
#include "sync/engine/control/engine_options.h"
#include "sync/engine/control/engine_readers.h"
#include "sync/engine/control/reply.h"
#include "sync/engine/control/session_routes.h"
#include "sync/engine/control/session_watchdog.h"
#include "sync/engine/runners/runner.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

class Engine {
 public:
  Engine(EngineOptions opts, std::unique_ptr<RunnerSet> runners);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Reply init_weights_update_group(const InitWeightsUpdateGroupRequest& request) {
    return buckets_.init_weights_update_group(request);
  }
  Reply destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request) {
    return buckets_.destroy_weights_update_group(request);
  }
  Reply pause_generation(const PauseGenerationRequest& request) {
    return sessions_.pause_generation(request);
  }
  Reply continue_generation(const ContinueGenerationRequest& request) {
    return sessions_.continue_generation(request);
  }
  Reply flush_cache() { return sessions_.flush_cache(); }
  Reply begin_weight_update(const BeginWeightUpdateRequest& request) {
    return sessions_.begin_weight_update(request);
  }
  Reply update_weights_from_distributed(const UpdateWeightsFromDistributedRequest& request) {
    return buckets_.update_weights_from_distributed(request);
  }
  Reply update_weight_version(const UpdateWeightVersionRequest& request) {
    return sessions_.update_weight_version(request);
  }
  Reply end_weight_update(const EndWeightUpdateRequest& request = {}) {
    return sessions_.end_weight_update(request);
  }
  Reply abort_weight_update(const AbortWeightUpdateRequest& request = {}) {
    return sessions_.abort_weight_update(request);
  }
  Reply release_lease(const ReleaseLeaseRequest& request) {
    return sessions_.release_lease(request);
  }
  Reply weights_checker(const WeightsCheckerRequest& request) {
    return readers_.weights_checker(request);
  }

  // Before the server stops: aborts the open session and every group, so handlers waiting for
  // buckets return at once.
  void shutdown();

  Reply health() const { return readers_.health(); }
  // Also served as /get_server_info, with the keys SGLang clients read (tp_size, dp_size,
  // pp_size, speculative_*, weight_version, internal_states, version).
  Reply server_info() const { return readers_.server_info(); }
  // /get_weight_version: {"weight_version"}; /model_info: SGLang's model info with it.
  Reply weight_version_info() const { return readers_.weight_version_info(); }
  Reply model_info() const { return readers_.model_info(); }
  Reply weights_checksum(const std::string& runner, bool recompute = false) const {
    return readers_.weights_checksum(runner, recompute);
  }
  Reply metrics() const { return readers_.metrics(); }
  Reply spec_accept_length() const { return readers_.spec_accept_length(); }

  // Read access for later probes (and tests): the runners' committed tensors and version.
  const RunnerSet& runners() const { return *runners_; }
  const EngineOptions& options() const { return opts_; }
  bool in_session() const { return receiver_->in_session(); }
  bool paused() const { return receiver_->paused(); }

 private:
  const EngineOptions opts_;
  const std::unique_ptr<RunnerSet> runners_;
  const std::unique_ptr<Receiver> receiver_;  // after runners_: its runners call into them
  EngineContext ctx_;
  SessionRoutes sessions_;
  BucketRoutes buckets_;
  EngineReaders readers_;
  SessionWatchdog watchdog_;  // last: its thread stops first
};

}  // namespace weightcast::sync::engine

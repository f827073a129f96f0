// Engine: the rollout engine's weight-update logic behind the HTTP routes, without HTTP.
//
// The control plane over one Receiver (sync/engine/commit/receiver.h), which is the whole data
// plane: the joined groups (one per trainer PP stage), staging, the digest and cross-rank checks
// and the commit's load into the runners. The Engine adds what a served engine needs around it: the
// session state machine with owners and leases (SessionMachine, Lease), sessionless updates, the
// two dialects' answers, pause/flush, the watchdog, metrics and readers. Its runners (RunnerSet)
// are the Receiver's runners: their load keeps the staged blocks, and a commit becomes visible
// to readers in one publish after every load returned. Each public method is one
// route: it takes the parsed request body and returns the Reply the route sends, so the whole
// protocol is testable without sockets (give EngineOptions a fake GroupConnector). Refusals
// (409 state, 400 input) change nothing. A failed, aborted or timed-out session discards its
// staging: the previous weights and weight_version stay. A watchdog thread aborts a session that
// sees no request for session_timeout while no bucket is in flight, and resumes generation left
// paused with no session and no request for as long (its trainer is gone).
// Lifetime: create with its runners, serve, destroy (which aborts groups and joins threads).
// Threading: every method is thread-safe; update_weights() blocks its caller until the bucket is
// received and staged (or failed), and several may wait at once, in any sequence order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "comm/deadline.h"
#include "sync/engine/commit/receiver.h"
#include "sync/engine/commit/weights_checker.h"
#include "sync/engine/control/engine_state.h"
#include "sync/engine/control/lease.h"
#include "sync/engine/control/reply.h"
#include "sync/engine/control/session.h"
#include "sync/engine/control/sessionless.h"
#include "sync/engine/receive/channel.h"
#include "sync/engine/receive/receive_pipeline.h"
#include "sync/engine/runners/runner.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

struct EngineOptions {
  int rank_count = 1;            // engine ranks (TP size), each a group member
  bool legacy_finalize = false;  // reproduce the old finalize (re-transform everything)
  comm::Millis init_timeout{60000};
  comm::Millis comm_timeout{60000};     // each bucket's broadcast
  comm::Millis session_timeout{60000};  // a session idle this long is aborted
  std::size_t max_bucket_bytes = std::size_t{4} << 30;
  std::uint64_t max_buckets_ahead = 8;
  ConnectOptions connect;  // rank_count and init_timeout are taken from above
  GroupConnector connector = connect_group;
  std::optional<std::string> speculative_algorithm;
  ProtocolLimits limits;
  // master_address values init_weights_update_group may dial, compared as text (ASCII case
  // folded, names never resolved); anything else is refused with 403 before any connection.
  // Empty: any address.
  std::vector<std::string> allowed_master_addresses;
  // What an update request with no session open may touch (sync/engine/control/sessionless.h).
  SessionlessRules sessionless;
  // A holder's lease when its begin asks for no time to live (sync/engine/control/lease.h).
  comm::Millis lease_ttl{300000};
  // Expert parallelism over the engine's ranks, reported in /server_info (ep_size, and which
  // experts each rank holds); the runners keep every expert, shared by the ranks.
  ExpertParallel experts;
};

class Engine {
 public:
  Engine(EngineOptions opts, std::unique_ptr<RunnerSet> runners);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Reply init_weights_update_group(const InitWeightsUpdateGroupRequest& request);
  Reply destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request);
  Reply pause_generation(const PauseGenerationRequest& request);
  Reply continue_generation(const ContinueGenerationRequest& request);
  Reply flush_cache();
  Reply begin_weight_update(const BeginWeightUpdateRequest& request);
  Reply update_weights_from_distributed(const UpdateWeightsFromDistributedRequest& request);
  Reply update_weight_version(const UpdateWeightVersionRequest& request);
  Reply end_weight_update(const EndWeightUpdateRequest& request = {});
  Reply abort_weight_update(const AbortWeightUpdateRequest& request = {});
  Reply release_lease(const ReleaseLeaseRequest& request);
  Reply weights_checker(const WeightsCheckerRequest& request);

  // Before the server stops: aborts the open session and every group, so handlers waiting for
  // buckets return at once.
  void shutdown();

  Reply health() const;
  // Also served as /get_server_info, with the keys SGLang clients read (tp_size, dp_size,
  // pp_size, speculative_*, weight_version, internal_states, version).
  Reply server_info() const;
  // /get_weight_version: {"weight_version"}; /model_info: SGLang's model info with it.
  Reply weight_version_info() const;
  Reply model_info() const;
  Reply weights_checksum(const std::string& runner, bool recompute = false) const;
  Reply metrics() const;
  // The speculative accept-length probe (sync/model/spec_probe.h) on the committed weights, each
  // read through its runner's layout: the target's embedding and lm_head, the draft's EAGLE fc.
  // Cached per (weight_version, digests); 409 when the engine holds no EAGLE-style draft.
  Reply spec_accept_length() const;

  // Read access for later probes (and tests): the runners' committed tensors and version.
  const RunnerSet& runners() const { return *runners_; }
  const EngineOptions& options() const { return opts_; }
  bool in_session() const;
  bool paused() const;

 private:
  void touch();
  // Ends the open session `session_id` as failed (no-op when it is no longer open): discards
  // staging; `abort_groups`: also aborts every group used in it, else only busy ones, whose
  // waiting bucket requests then answer `status`.
  void fail_session_locked(std::uint64_t session_id, const std::string& reason, bool abort_groups,
                           int status);
  // The bucket route in the engine's own statuses (update_weights_from_distributed() puts the
  // answer in the request's dialect).
  Reply receive_bucket(const UpdateWeightsFromDistributedRequest& request);
  // receive_bucket()'s first step, under the lock: opens a sessionless update's session when the
  // request needs one (taking `serial` for it) and queues the request on the receiver; the reply
  // of a refusal, else the ticket and the sessionless session's token.
  struct Admitted {
    Receiver::Ticket ticket;
    std::optional<std::string> sessionless_token;
  };
  std::variant<Reply, Admitted> admit_bucket(const UpdateWeightsFromDistributedRequest& request,
                                             std::unique_lock<std::timed_mutex>& serial);
  // Opens the one-request session of a sessionless update (sync/engine/control/sessionless.h).
  // Returns the session's token, or why it was refused.
  std::variant<Refusal, std::string> open_sessionless_locked(
      const UpdateWeightsFromDistributedRequest& request);
  // Commits the open session through the receiver and publishes it in the runners, closes the
  // session, then flushes the caches when a bucket asked for it (flush_cache): the reply of a
  // failed commit (the session is then failed, previous weights kept), else what each runner
  // did and what the flush dropped.
  struct Committed {
    std::vector<RunnerCommit> runners;
    std::string flush_note;  // empty: no flush asked for
    Selector selector = Selector::kAll;
  };
  // `token`: the session_id the committing call carried (the receiver checks it).
  std::variant<Reply, Committed> commit_locked(const std::optional<std::string>& token);
  // Checks a bucket request against the session and queues it on the receiver (which checks it
  // against its groups and runners). `sessionless`: the request opened the session itself (no
  // owner check).
  std::variant<Refusal, Receiver::Ticket> submit_bucket_locked(
      const UpdateWeightsFromDistributedRequest& request,
      const std::optional<std::string>& sessionless_token);
  void watchdog_loop(std::stop_token stop);

  const EngineOptions opts_;
  const std::unique_ptr<RunnerSet> runners_;
  const std::unique_ptr<Receiver> receiver_;  // after runners_: its runners call into them
  mutable std::mutex mu_;
  Lease lease_;
  // Held for the whole of a sessionless update, so they apply one at a time.
  std::timed_mutex sessionless_mu_;
  WeightsChecker checker_;
  std::chrono::steady_clock::time_point session_start_;
  comm::Deadline last_activity_;
  EngineCounters counters_;         // for /metrics, guarded by mu_
  mutable ProbeCache probe_cache_;  // /spec_accept_length's last answer (its own lock)
  std::condition_variable_any watchdog_cv_;
  std::jthread watchdog_;
};

}  // namespace weightcast::sync::engine

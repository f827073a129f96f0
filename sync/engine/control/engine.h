// Engine: the rollout engine's weight-update logic behind the HTTP routes, without HTTP.
//
// The control plane over one Receiver (sync/engine/commit/receiver.h), which is the whole data
// plane and holds the one session state machine: the joined groups (one per trainer PP stage),
// sessions with their owners, staging, the digest and cross-rank checks and the commit's load
// into the runners. The Engine adds what a served engine needs around it, as small parts:
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

// What the Engine's parts share, built before them: the options, the runner set, the one Receiver
// and the context over them.
class EngineCore {
 protected:
  EngineCore(EngineOptions opts, std::unique_ptr<RunnerSet> runners);

  const EngineOptions opts_;
  const std::unique_ptr<RunnerSet> runners_;
  const std::unique_ptr<Receiver> receiver_;  // after runners_: its runners call into them
  EngineContext context_;
};

// The routes are its parts' own methods: SessionRoutes (begin, update_weight_version, end,
// abort, release_lease, pause/continue, flush_cache), BucketRoutes (init/destroy group,
// update_weights_from_distributed), EngineReaders (health, server_info, weight_version_info,
// model_info, weights_checksum, metrics, spec_accept_length, weights_checker).
class Engine : private EngineCore, public SessionRoutes, public BucketRoutes, public EngineReaders {
 public:
  Engine(EngineOptions opts, std::unique_ptr<RunnerSet> runners);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Before the server stops: aborts the open session and every group, so handlers waiting for
  // buckets return at once.
  void shutdown();

  // Read access for later probes (and tests): the runners' committed tensors and version.
  const RunnerSet& runners() const { return *runners_; }
  const EngineOptions& options() const { return opts_; }
  bool in_session() const { return receiver_->in_session(); }
  bool paused() const { return receiver_->paused(); }

 private:
  SessionWatchdog watchdog_;  // its thread stops first
};

}  // namespace weightcast::sync::engine

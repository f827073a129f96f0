// EngineContext: what the parts of weightcast-engine's control plane share (sync/engine/control/
// engine.h): the options, the runner set, the one Receiver (whose session state machine is the
// engine's), the lock the parts take around a check and its change, the lease, counters, the
// speculative probe's cache and the last activity the watchdog reads. Its methods are the two
// ends of a session every part may reach: a failure, and a commit published to the runners.
// Lifetime: owned by the Engine (its core), outlived by none of its parts. Threading: fields marked
// "under mu" are read and written under `mu`; the Receiver and the runner set are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "comm/deadline.h"
#include "sync/engine/commit/receiver.h"
#include "sync/engine/control/engine_options.h"
#include "sync/engine/control/engine_state.h"
#include "sync/engine/control/lease.h"
#include "sync/engine/control/reply.h"
#include "sync/engine/runners/runner.h"

namespace weightcast::sync::engine {

// What a commit did: each covered runner, the flush it asked for, and the session's selector.
struct Committed {
  std::vector<RunnerCommit> runners;
  std::string flush_note;  // empty: no flush asked for
  Selector selector = Selector::kAll;
  std::string adapter;      // an adapter session's commit: the adapter swapped in
  std::string lora_digest;  // ... and its digest
};

class EngineContext {
 public:
  EngineContext(const EngineOptions& options, RunnerSet& runner_set, Receiver& data_plane);
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // Records a request as activity (takes mu).
  void touch();
  // Ends the open session `session_id` as failed (no-op when it is no longer open): the receiver
  // discards staging; `abort_groups`: also aborts every group used in it, else only busy ones,
  // whose waiting bucket requests then answer `status`. Counts a failed update. Under mu.
  void fail_session_locked(std::uint64_t session_id, const std::string& reason, bool abort_groups,
                           int status);
  // Commits the open session through the receiver (which checks it against `token`, the
  // session_id the committing call carried) and publishes it in the runners, then flushes the
  // caches when a bucket asked for it (flush_cache). A refusal's reply leaves the session as it
  // was; a failed commit's reply means the session ended and the previous weights stay. Under mu.
  std::variant<Reply, Committed> commit_locked(const std::optional<std::string>& token);

  const EngineOptions& opts;
  RunnerSet& runners;
  Receiver& receiver;
  mutable std::mutex mu;
  Lease lease;                                          // under mu
  EngineCounters counters;                              // under mu
  comm::Deadline last_activity;                         // under mu
  std::chrono::steady_clock::time_point session_start;  // under mu
  mutable ProbeCache probe_cache;                       // its own lock
  // comm::host_identity() of this process, read once: /server_info's colocate_host.
  const std::string host_identity;
};

}  // namespace weightcast::sync::engine

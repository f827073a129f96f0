#include "sync/engine/control/engine_context.h"

#include "comm/errors.h"
#include "comm/host_identity.h"

namespace weightcast::sync::engine {

EngineContext::EngineContext(const EngineOptions& options, RunnerSet& runner_set,
                             Receiver& data_plane)
    : opts(options),
      runners(runner_set),
      receiver(data_plane),
      host_identity(comm::host_identity()) {
  last_activity = comm::Clock::now();
}

void EngineContext::touch() {
  std::lock_guard lock(mu);
  last_activity = comm::Clock::now();
}

void EngineContext::fail_session_locked(std::uint64_t session_id, const std::string& reason,
                                        bool abort_groups, int status) {
  // The receiver discards staging. A group with a bucket in flight cannot be left half-way
  // through a broadcast; with abort_groups (timeout) every group of the session goes, since its
  // trainer is gone. A no-op when that session already ended.
  if (receiver.abort_session(session_id, reason, status, abort_groups)) {
    counters.update_failed();
  }
}

std::variant<Reply, Committed> EngineContext::commit_locked(
    const std::optional<std::string>& token) {
  const auto open = receiver.session();
  std::vector<RunnerCommit> commits;
  ReceiverCommit done;
  try {
    // Checks the session and every rank's digests, loads each covered runner (pending, not yet
    // visible), then publishes all of them at once with the version.
    done = receiver.commit(std::nullopt, token,
                           [&](Selector selector, const std::optional<std::string>& version) {
                             commits = runners.publish(selector, version, opts.legacy_finalize);
                           });
  } catch (const std::exception& e) {
    // Nothing was published; the previous weights and version stay.
    runners.discard_pending();
    const auto* refused = dynamic_cast<const ReceiverError*>(&e);
    // Refused before anything was taken (no session, another owner, buckets in flight): the
    // session, if any, stays as it was.
    if (refused && (!open || receiver.session())) return error_reply(refused->status(), e.what());
    const int status = refused ? refused->status() : failure_status(e);
    last_activity = comm::Clock::now();
    counters.update_failed();
    return error_reply(status, std::string("end_weight_update: commit failed: ") + e.what() +
                                   "; previous weights kept");
  }
  last_activity = comm::Clock::now();
  counters.update_ok(comm::seconds_since(session_start));
  Committed out{std::move(commits), "", done.selector, done.adapter, done.lora_digest};
  if (done.flush_requested) {
    // What this engine caches from its weights: the speculative probe's last answer.
    probe_cache.drop();
    counters.flushed();
    out.flush_note = "; cache flushed (the speculative probe's cached answer)";
  }
  return out;
}

}  // namespace weightcast::sync::engine

#include "sync/engine/control/engine.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/engine/control/dialect.h"
#include "sync/engine/runners/delta_base.h"

namespace weightcast::sync::engine {

namespace {

using Json = nlohmann::json;

Reply ok_basic(std::string message) {
  return {200, to_json_string(BasicResponse{true, std::move(message)})};
}

Reply refused(const Refusal& refusal) {
  return error_reply(refusal.status, refusal.message);
}

// The data plane of all of the engine's ranks in this process: one Receiver over every rank,
// loading into the runner set and rebuilding delta bases from its committed weights.
std::unique_ptr<Receiver> make_receiver(const EngineOptions& opts, RunnerSet* set) {
  WC_ENFORCE(set != nullptr);
  RunnerSet& runners = *set;
  WC_ENFORCE_EQ(runners.rank_count(), opts.rank_count, "runner set built for another rank count");
  WC_ENFORCE(static_cast<bool>(opts.connector), "a group connector is required");
  ReceiverOptions r;
  r.place.rank_count = opts.rank_count;
  r.place.local_ranks = opts.rank_count;
  r.init_timeout = opts.init_timeout;
  r.comm_timeout = opts.comm_timeout;
  r.max_bucket_bytes = opts.max_bucket_bytes;
  r.max_buckets_ahead = opts.max_buckets_ahead;
  r.connect = opts.connect;
  r.version = runners.version();  // one weight_version: the runner set's, set as it publishes
  r.group_connector = opts.connector;
  r.experts = opts.experts;
  r.pool = runners.block_pool();
  r.base_source = [&runners](const BucketPlan& plan,
                             const std::vector<std::vector<Runner>>& destinations,
                             const std::vector<Digest>& expected, const std::string& base_version,
                             std::span<std::byte> bucket) {
    return fill_delta_base(runners, plan, destinations, expected, base_version, bucket);
  };
  // The runners keep the staged blocks as their weights and recompute digests on request
  // (/weights_checksum?recompute): the digests taken at receive stand.
  r.verify_at_commit = false;
  std::vector<ReceiverRunner> loaders;
  for (Runner id : runners.runners()) loaders.push_back(runners.receiver_runner(id));
  return std::make_unique<Receiver>(std::move(r), std::move(loaders));
}

}  // namespace

Engine::Engine(EngineOptions opts, std::unique_ptr<RunnerSet> runners)
    : opts_(std::move(opts)),
      runners_(std::move(runners)),
      receiver_(make_receiver(opts_, runners_.get())) {
  // The runners, rank count, timeouts and connector were checked by make_receiver() and the
  // Receiver it built; the session timeout is the engine's own.
  WC_ENFORCE_GT(opts_.session_timeout.count(), 0);
  last_activity_ = comm::Clock::now();
  watchdog_ = std::jthread([this](std::stop_token stop) { watchdog_loop(stop); });
}

Engine::~Engine() {
  watchdog_.request_stop();
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // receiver_ goes next (member order): it aborts its groups and joins their threads.
}

void Engine::shutdown() {
  std::lock_guard lock(mu_);
  if (auto open = receiver_->session()) {
    fail_session_locked(open->id, "engine shutting down", /*abort_groups=*/true, 503);
  }
  receiver_->abort_groups(503, "engine shutting down");
}

void Engine::touch() {
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
}

bool Engine::in_session() const {
  return receiver_->in_session();
}

bool Engine::paused() const {
  return receiver_->paused();
}

void Engine::watchdog_loop(std::stop_token stop) {
  const auto period = std::clamp(opts_.session_timeout / 4, comm::Millis(10), comm::Millis(200));
  std::unique_lock lock(mu_);
  while (!stop.stop_requested()) {
    watchdog_cv_.wait_for(lock, stop, period, [] { return false; });
    if (stop.stop_requested()) continue;
    const auto open = receiver_->session();
    if (!open) {
      // A trainer pauses generation for an update and resumes it at the end, even after a
      // failure; a pause that sees no session and no request for this long was left by a
      // trainer that died, and would otherwise last forever.
      if (receiver_->paused() && comm::Clock::now() - last_activity_ >= opts_.session_timeout) {
        receiver_->set_paused(false);
      }
      continue;
    }
    // A bucket in flight is bounded by the group's collective timeout, not by this one.
    if (receiver_->busy()) {
      last_activity_ = comm::Clock::now();
      continue;
    }
    if (comm::Clock::now() - last_activity_ < opts_.session_timeout) continue;
    fail_session_locked(open->id,
                        "session timed out: no request for " +
                            std::to_string(opts_.session_timeout.count()) + " ms",
                        /*abort_groups=*/true, 504);
  }
}

void Engine::fail_session_locked(std::uint64_t session_id, const std::string& reason,
                                 bool abort_groups, int status) {
  // The receiver discards staging. A group with a bucket in flight cannot be left half-way
  // through a broadcast; with abort_groups (timeout) every group of the session goes, since its
  // trainer is gone. A no-op when that session already ended.
  if (receiver_->abort_session(session_id, reason, status, abort_groups)) {
    counters_.update_failed();
  }
}

Reply Engine::pause_generation(const PauseGenerationRequest& request) {
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  const bool was = receiver_->paused();
  receiver_->set_paused(true);
  return ok_basic(std::string(was ? "generation already paused" : "generation paused") + " (mode " +
                  std::string(to_string(request.mode)) + ")");
}

Reply Engine::continue_generation(const ContinueGenerationRequest&) {
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  const bool was = receiver_->paused();
  receiver_->set_paused(false);
  return ok_basic(was ? "generation resumed" : "generation was not paused");
}

Reply Engine::flush_cache() {
  probe_cache_.drop();  // the probe's cached answer: the next probe reads the weights again
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  counters_.flushed();
  return ok_basic("cache flushed");
}

// Refused calls (busy, wrong owner, leased) do not count as activity: a session whose holder
// vanished still times out while another client keeps knocking.
Reply Engine::begin_weight_update(const BeginWeightUpdateRequest& request) {
  const bool native = native_request(request);
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (auto refusal = lease_.check(request.holder, request.lease_id, "begin_weight_update", now)) {
    return in_dialect(native, refused(*refusal));
  }
  ReceiverBegin begun;
  try {
    begun = receiver_->begin(request.selector, request.holder);
  } catch (const ReceiverError& e) {
    return in_dialect(native, error_reply(e.status(), e.what()));
  }
  last_activity_ = comm::Clock::now();
  session_start_ = now;
  BeginWeightUpdateResponse response;
  response.message = "session opened";
  response.selector = request.selector;
  response.session_id = begun.session_id;
  response.holder = request.holder.value_or("");
  if (request.holder) {
    const comm::Millis ttl =
        request.lease_ttl_s ? comm::Millis(*request.lease_ttl_s * 1000) : opts_.lease_ttl;
    response.lease_id = lease_.take(*request.holder, ttl, now);
    response.lease_ttl_s = static_cast<std::uint64_t>(ttl.count() / 1000);
  }
  response.weight_version = runners_->weight_version();
  response.runner_digest = to_string(runners_->covered_digest(request.selector));
  return {200, to_json_string(response)};
}

Reply Engine::release_lease(const ReleaseLeaseRequest& request) {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (!lease_.alive(now)) return ok_basic("no lease was held");
  const std::string holder = lease_.holder();
  if (auto refusal = lease_.release(request.lease_id, request.force, now)) return refused(*refusal);
  std::string note;
  // A forced break also ends the holder's open session: the operator wants the engine back.
  if (const auto open = receiver_->session(); request.force && open && open->owned) {
    fail_session_locked(open->id, "lease of '" + holder + "' broken by force",
                        /*abort_groups=*/false, 409);
    note = "; its open session was aborted, previous weights kept";
  }
  return ok_basic("lease of '" + holder + "' released" + note);
}

Reply Engine::weights_checker(const WeightsCheckerRequest& request) {
  touch();
  return checker_.handle(*runners_, request);
}

Reply Engine::update_weight_version(const UpdateWeightVersionRequest& request) {
  std::lock_guard lock(mu_);
  bool applied = false;
  try {
    applied = receiver_->set_version(request.new_version, request.session_id);
  } catch (const ReceiverError& e) {
    return in_dialect(native_request(request), error_reply(e.status(), e.what()));
  }
  last_activity_ = comm::Clock::now();
  // abort_all_requests (SGLang's default true): this engine generates nothing, so there is never
  // a request in flight to abort; the answer says so rather than ignoring the field.
  const std::string aborted =
      request.abort_all_requests ? " (abort_all_requests: no request was in flight)" : "";
  if (applied) {
    Json j = Json::parse(to_json_string(
        BasicResponse{true, "Weight version updated to " + request.new_version + aborted}));
    j["new_version"] = request.new_version;
    return {200, j.dump()};
  }
  return ok_basic("weight_version '" + request.new_version + "' staged for end_weight_update" +
                  aborted);
}

Reply Engine::end_weight_update(const EndWeightUpdateRequest& request) {
  const bool native = native_request(request);
  std::lock_guard lock(mu_);
  const auto open = receiver_->session();
  // The receiver's commit checks the session (open, owner, no bucket in flight): one check.
  auto committed = commit_locked(request.session_id);
  if (auto* failure = std::get_if<Reply>(&committed)) return in_dialect(native, *failure);
  const auto& done = std::get<Committed>(committed);
  if (open && open->owned) lease_.renew(std::chrono::steady_clock::now());
  EndWeightUpdateResponse response;
  response.message = opts_.legacy_finalize
                         ? "committed (legacy finalize: every resident tensor re-processed)"
                         : "committed";
  response.message += done.flush_note;
  response.weight_version = runners_->weight_version();
  for (const auto& c : done.runners) {
    response.runners.push_back({c.runner, c.tensors_loaded, c.tensors_transformed});
  }
  response.runner_digest = to_string(runners_->covered_digest(done.selector));
  return {200, to_json_string(response)};
}

std::variant<Reply, Engine::Committed> Engine::commit_locked(
    const std::optional<std::string>& token) {
  const auto open = receiver_->session();
  std::vector<RunnerCommit> commits;
  ReceiverCommit done;
  try {
    // Checks the session and every rank's digests, loads each covered runner (pending, not yet
    // visible), then publishes all of them at once with the version.
    done = receiver_->commit(
        std::nullopt, token, [&](Selector selector, const std::optional<std::string>& version) {
          commits = runners_->publish(selector, version, opts_.legacy_finalize);
        });
  } catch (const std::exception& e) {
    // Nothing was published; the previous weights and version stay.
    runners_->discard_pending();
    const auto* refused = dynamic_cast<const ReceiverError*>(&e);
    // Refused before anything was taken (no session, another owner, buckets in flight): the
    // session, if any, stays as it was.
    if (refused && (!open || receiver_->session())) return error_reply(refused->status(), e.what());
    const int status = refused ? refused->status() : failure_status(e);
    last_activity_ = comm::Clock::now();
    counters_.update_failed();
    return error_reply(status, std::string("end_weight_update: commit failed: ") + e.what() +
                                   "; previous weights kept");
  }
  last_activity_ = comm::Clock::now();
  counters_.update_ok(comm::seconds_since(session_start_));
  Committed out{std::move(commits), "", done.selector};
  if (done.flush_requested) {
    // What this engine caches from its weights: the speculative probe's last answer.
    probe_cache_.drop();
    counters_.flushed();
    out.flush_note = "; cache flushed (the speculative probe's cached answer)";
  }
  return out;
}

Reply Engine::abort_weight_update(const AbortWeightUpdateRequest& request) {
  std::lock_guard lock(mu_);
  const auto open = receiver_->session();
  if (!open) return ok_basic("no session was open");
  if (!request.force) {
    if (auto refusal = receiver_->check_owner(request.session_id, "abort_weight_update")) {
      return in_dialect(native_request(request), refused(*refusal));
    }
  }
  last_activity_ = comm::Clock::now();
  const std::string why =
      request.force ? "aborted by a forced abort_weight_update (held by " + open->holder_text + ")"
                    : std::string("aborted by abort_weight_update");
  fail_session_locked(open->id, why, /*abort_groups=*/false, 409);
  return ok_basic("session aborted; staged tensors discarded, previous weights kept");
}

}  // namespace weightcast::sync::engine

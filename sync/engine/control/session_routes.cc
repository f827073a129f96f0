#include "sync/engine/control/session_routes.h"

#include <nlohmann/json.hpp>

#include "sync/engine/control/dialect.h"

namespace weightcast::sync::engine {

namespace {

using Json = nlohmann::json;

}  // namespace

Reply SessionRoutes::pause_generation(const PauseGenerationRequest& request) {
  std::lock_guard lock(ctx_.mu);
  ctx_.last_activity = comm::Clock::now();
  const bool was = ctx_.receiver.paused();
  ctx_.receiver.set_paused(true);
  return ok_reply(std::string(was ? "generation already paused" : "generation paused") + " (mode " +
                  std::string(to_string(request.mode)) + ")");
}

Reply SessionRoutes::continue_generation(const ContinueGenerationRequest&) {
  std::lock_guard lock(ctx_.mu);
  ctx_.last_activity = comm::Clock::now();
  const bool was = ctx_.receiver.paused();
  ctx_.receiver.set_paused(false);
  return ok_reply(was ? "generation resumed" : "generation was not paused");
}

Reply SessionRoutes::flush_cache() {
  ctx_.probe_cache.drop();  // the probe's cached answer: the next probe reads the weights again
  std::lock_guard lock(ctx_.mu);
  ctx_.last_activity = comm::Clock::now();
  ctx_.counters.flushed();
  return ok_reply("cache flushed");
}

// Refused calls (busy, wrong owner, leased) do not count as activity: a session whose holder
// vanished still times out while another client keeps knocking.
Reply SessionRoutes::begin_weight_update(const BeginWeightUpdateRequest& request) {
  const bool native = native_request(request);
  std::lock_guard lock(ctx_.mu);
  const auto now = std::chrono::steady_clock::now();
  if (auto refusal =
          ctx_.lease.check(request.holder, request.lease_id, "begin_weight_update", now)) {
    return in_dialect(native, refusal_reply(*refusal));
  }
  std::optional<AdapterTarget> adapter;
  if (request.lora) {
    try {
      adapter = adapter_target(*request.lora);
    } catch (const comm::BadRequestError& e) {
      return error_reply(400, e.what());
    }
  }
  ReceiverBegin begun;
  try {
    begun = ctx_.receiver.begin(request.selector, request.holder, false, std::move(adapter));
  } catch (const ReceiverError& e) {
    return in_dialect(native, error_reply(e.status(), e.what()));
  }
  ctx_.last_activity = comm::Clock::now();
  ctx_.session_start = now;
  BeginWeightUpdateResponse response;
  response.message = "session opened";
  response.selector = request.selector;
  response.session_id = begun.session_id;
  response.holder = request.holder.value_or("");
  if (request.holder) {
    const comm::Millis ttl =
        request.lease_ttl_s ? comm::Millis(*request.lease_ttl_s * 1000) : ctx_.opts.lease_ttl;
    response.lease_id = ctx_.lease.take(*request.holder, ttl, now);
    response.lease_ttl_s = static_cast<std::uint64_t>(ttl.count() / 1000);
  }
  response.weight_version = ctx_.runners.weight_version();
  response.runner_digest = to_string(ctx_.runners.covered_digest(request.selector));
  response.lora_version = begun.lora_version;
  response.lora_digest = begun.lora_digest;
  return {200, to_json_string(response)};
}

Reply SessionRoutes::unload_lora_adapter(const UnloadLoraAdapterRequest& request) {
  std::lock_guard lock(ctx_.mu);
  if (!ctx_.receiver.unload_adapter(request.lora_name)) {
    return error_reply(404, "lora_name: no adapter '" + request.lora_name + "' is loaded");
  }
  return ok_reply("adapter '" + request.lora_name + "' unloaded");
}

Reply SessionRoutes::release_lease(const ReleaseLeaseRequest& request) {
  std::lock_guard lock(ctx_.mu);
  const auto now = std::chrono::steady_clock::now();
  if (!ctx_.lease.alive(now)) return ok_reply("no lease was held");
  const std::string holder = ctx_.lease.holder();
  if (auto refusal = ctx_.lease.release(request.lease_id, request.force, now))
    return refusal_reply(*refusal);
  std::string note;
  // A forced break also ends the holder's open session: the operator wants the engine back.
  if (const auto open = ctx_.receiver.session(); request.force && open && open->owned) {
    ctx_.fail_session_locked(open->id, "lease of '" + holder + "' broken by force",
                             /*abort_groups=*/false, 409);
    note = "; its open session was aborted, previous weights kept";
  }
  return ok_reply("lease of '" + holder + "' released" + note);
}

Reply SessionRoutes::update_weight_version(const UpdateWeightVersionRequest& request) {
  std::lock_guard lock(ctx_.mu);
  bool applied = false;
  try {
    applied = ctx_.receiver.set_version(request.new_version, request.session_id);
  } catch (const ReceiverError& e) {
    return in_dialect(native_request(request), error_reply(e.status(), e.what()));
  }
  ctx_.last_activity = comm::Clock::now();
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
  return ok_reply("weight_version '" + request.new_version + "' staged for end_weight_update" +
                  aborted);
}

Reply SessionRoutes::end_weight_update(const EndWeightUpdateRequest& request) {
  const bool native = native_request(request);
  std::lock_guard lock(ctx_.mu);
  const auto open = ctx_.receiver.session();
  // The receiver's commit checks the session (open, owner, no bucket in flight): one check.
  auto committed = ctx_.commit_locked(request.session_id);
  if (auto* failure = std::get_if<Reply>(&committed)) return in_dialect(native, *failure);
  const auto& done = std::get<Committed>(committed);
  if (open && open->owned) ctx_.lease.renew(std::chrono::steady_clock::now());
  EndWeightUpdateResponse response;
  response.message = ctx_.opts.legacy_finalize
                         ? "committed (legacy finalize: every resident tensor re-processed)"
                         : "committed";
  if (!done.adapter.empty()) response.message = "adapter '" + done.adapter + "' committed";
  response.message += done.flush_note;
  response.weight_version = ctx_.runners.weight_version();
  for (const auto& c : done.runners) {
    response.runners.push_back({c.runner, c.tensors_loaded, c.tensors_transformed});
  }
  response.runner_digest = to_string(ctx_.runners.covered_digest(done.selector));
  response.lora_digest = done.lora_digest;
  return {200, to_json_string(response)};
}

Reply SessionRoutes::abort_weight_update(const AbortWeightUpdateRequest& request) {
  std::lock_guard lock(ctx_.mu);
  const auto open = ctx_.receiver.session();
  if (!open) return ok_reply("no session was open");
  if (!request.force) {
    if (auto refusal = ctx_.receiver.check_owner(request.session_id, "abort_weight_update")) {
      return in_dialect(native_request(request), refusal_reply(*refusal));
    }
  }
  ctx_.last_activity = comm::Clock::now();
  const std::string why =
      request.force ? "aborted by a forced abort_weight_update (held by " + open->holder_text + ")"
                    : std::string("aborted by abort_weight_update");
  ctx_.fail_session_locked(open->id, why, /*abort_groups=*/false, 409);
  return ok_reply("session aborted; staged tensors discarded, previous weights kept");
}

}  // namespace weightcast::sync::engine

#include "sync/engine/control/bucket_routes.h"

#include <algorithm>
#include <variant>

#include "comm/errors.h"
#include "sync/engine/control/dialect.h"
#include "sync/engine/control/sessionless.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync::engine {

namespace {

std::string runner_list(const std::vector<RunnerCommit>& commits) {
  std::string out;
  for (const auto& c : commits) {
    out += (out.empty() ? "" : ", ") + std::string(to_string(c.runner)) + " (" +
           std::to_string(c.tensors_loaded) + " tensors)";
  }
  return out.empty() ? std::string("no runner") : out;
}

// Text comparison only: resolving a name here would itself reach out to the network, and a
// name that resolves differently later would slip past the check.
bool address_allowed(const std::vector<std::string>& allowed, const std::string& address) {
  if (allowed.empty()) return true;
  auto fold = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return std::any_of(allowed.begin(), allowed.end(), [&](const std::string& a) {
    return a.size() == address.size() &&
           std::equal(a.begin(), a.end(), address.begin(),
                      [&](char x, char y) { return fold(x) == fold(y); });
  });
}

// The request's own checks, before anything is dialled: a refused address is never contacted.
std::optional<Reply> refuse_init(const EngineOptions& opts,
                                 const InitWeightsUpdateGroupRequest& request) {
  if (!address_allowed(opts.allowed_master_addresses, request.master_address)) {
    std::string list;
    for (const auto& a : opts.allowed_master_addresses) list += (list.empty() ? "" : ",") + a;
    return error_reply(403, "master_address: " + quoted(request.master_address) +
                                " is not in this engine's --allowed-master-addresses (" + list +
                                ")");
  }
  // rank_offset and world_size are the receiver's checks (Receiver::join), before it dials.
  const auto available = comm::available_backends();
  const std::string backend(to_string(request.backend));
  if (std::find(available.begin(), available.end(), backend) == available.end()) {
    return error_reply(400, "backend: '" + backend + "' is not built into this engine");
  }
  return std::nullopt;
}

// Field for field: the spec is what the request names, in one expression.
GroupSpec group_spec(const InitWeightsUpdateGroupRequest& request) {
  return {.group_name = request.group_name,
          .master_address = request.master_address,
          .master_port = request.master_port,
          .rank_offset = request.rank_offset,
          .world_size = request.world_size,
          .backend = request.backend,
          .rendezvous = request.rendezvous,
          .ranks = request.ranks};
}

}  // namespace

Reply BucketRoutes::init_weights_update_group(const InitWeightsUpdateGroupRequest& request) {
  ctx_.touch();
  const bool native = native_request(request);
  const std::string& name = request.group_name;
  if (auto refusal = refuse_init(ctx_.opts, request)) return in_dialect(native, *refusal);
  const GroupSpec spec = group_spec(request);
  // The receiver reserves the name, replaces an idle group of that name and joins, bounded by
  // --init-timeout-ms; the engine's lock is not held meanwhile.
  try {
    ctx_.receiver.join(spec);
  } catch (const ReceiverError& e) {
    ctx_.touch();
    return in_dialect(
        native, error_reply(e.status(), std::string("init_weights_update_group: ") + e.what()));
  }
  ctx_.touch();
  return ok_reply("joined group '" + name + "' as ranks " + std::to_string(spec.rank_offset) +
                  ".." + std::to_string(spec.rank_offset + ctx_.opts.rank_count - 1) + " of " +
                  std::to_string(spec.world_size));
}

Reply BucketRoutes::destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request) {
  std::lock_guard lock(ctx_.mu);
  ctx_.last_activity = comm::Clock::now();
  std::string note;
  try {
    // SGLang's answer to an unknown group, word for word, in both dialects: a trainer that
    // destroys before it initializes (Miles) ignores it. The receiver ends the open session when
    // it relied on the group.
    if (ctx_.receiver.leave(request.group_name)) {
      ctx_.counters.update_failed();
      note = "; the open session was aborted and its staging discarded";
    }
  } catch (const ReceiverError& e) {
    return error_reply(e.status(), e.what());
  }
  return ok_reply("left group '" + request.group_name + "'" + note);
}

std::variant<Refusal, Receiver::Ticket> BucketRoutes::submit_bucket_locked(
    const UpdateWeightsFromDistributedRequest& request,
    const std::optional<std::string>& sessionless_token) {
  // The receiver checks the request against its session (open, selector, owner): one check. A
  // sessionless update's request carries the session's token, and its session already has the
  // scope the request's selector was narrowed to.
  UpdateWeightsFromDistributedRequest forwarded = request;
  if (sessionless_token) {
    forwarded.session_id = sessionless_token;
    forwarded.selector.reset();
  }
  try {
    Receiver::Ticket ticket = ctx_.receiver.submit(forwarded);
    ctx_.last_activity = comm::Clock::now();
    return ticket;
  } catch (const ReceiverError& e) {
    return Refusal{e.status(), e.what()};
  }
}

Reply BucketRoutes::update_weights_from_distributed(
    const UpdateWeightsFromDistributedRequest& request) {
  return in_dialect(native_request(request), receive_bucket(request));
}

std::variant<Refusal, std::string> BucketRoutes::open_sessionless_locked(
    const UpdateWeightsFromDistributedRequest& request) {
  if (auto refusal = ctx_.lease.check(std::nullopt, std::nullopt, "update_weights_from_distributed",
                                      std::chrono::steady_clock::now())) {
    return *refusal;
  }
  auto scope = sessionless_scope(ctx_.runners.runners(), request.selector, ctx_.opts.sessionless);
  if (auto* refusal = std::get_if<Refusal>(&scope)) return *refusal;
  try {
    std::string token =
        ctx_.receiver.begin(std::get<Selector>(scope), std::nullopt, /*sessionless=*/true)
            .session_id;
    ctx_.session_start = std::chrono::steady_clock::now();
    return token;
  } catch (const ReceiverError& e) {
    return Refusal{e.status(), e.what()};
  }
}

std::variant<Reply, BucketRoutes::Admitted> BucketRoutes::admit_bucket(
    const UpdateWeightsFromDistributedRequest& request,
    std::unique_lock<std::timed_mutex>& serial) {
  std::unique_lock lock(ctx_.mu);
  std::optional<std::string> sessionless_token;
  // Native requests never open a sessionless update: one carrying a session id whose session
  // is gone must fail, not be applied on its own.
  if (!ctx_.receiver.in_session() && !native_request(request)) {
    lock.unlock();
    if (!serial.try_lock_for(ctx_.opts.comm_timeout)) {
      return error_reply(409,
                         "update_weights_from_distributed: another sessionless update "
                         "did not finish within " +
                             std::to_string(ctx_.opts.comm_timeout.count()) + " ms");
    }
    lock.lock();
    if (ctx_.receiver.in_session()) {
      serial.unlock();  // a session opened meanwhile: this request is its payload
    } else {
      auto opened = open_sessionless_locked(request);
      if (auto* refusal = std::get_if<Refusal>(&opened)) return refusal_reply(*refusal);
      sessionless_token = std::get<std::string>(std::move(opened));
    }
  }
  auto submitted = submit_bucket_locked(request, sessionless_token);
  if (auto* refusal = std::get_if<Refusal>(&submitted)) {
    if (sessionless_token) {
      if (auto open = ctx_.receiver.session()) {
        ctx_.fail_session_locked(open->id, "refused", /*abort_groups=*/false, 400);
      }
    }
    return refusal_reply(*refusal);
  }
  return Admitted{std::get<Receiver::Ticket>(std::move(submitted)), sessionless_token};
}

Reply BucketRoutes::receive_bucket(const UpdateWeightsFromDistributedRequest& request) {
  // Held from the sessionless session's opening to its commit, so such updates apply one at a
  // time (slime and SGLang clients keep one request in flight anyway).
  std::unique_lock<std::timed_mutex> serial(sessionless_mu_, std::defer_lock);
  auto admitted = admit_bucket(request, serial);
  if (auto* refused = std::get_if<Reply>(&admitted)) return *refused;
  const auto& [ticket, sessionless_token] = std::get<Admitted>(admitted);
  const ReceiveOutcome outcome = ctx_.receiver.wait(ticket);
  if (outcome.failure) {
    const ReceiveFailure& f = *outcome.failure;
    // 409: the session was aborted by a request while this bucket was received; the group is
    // fine and the session already ended.
    if (f.stale) return error_reply(409, f.reason);
    // The receiver ended its session (and aborted a broken group).
    std::lock_guard lock(ctx_.mu);
    ctx_.last_activity = comm::Clock::now();
    if (f.ended_session) ctx_.counters.update_failed();
    // A bucket received but not applicable (a delta whose base this engine does not hold, or a
    // bad payload) leaves the group; a broken group does not.
    return error_reply(f.status, std::string("update_weights_from_distributed") +
                                     (f.group_failed ? " failed: " : ": ") + f.reason +
                                     "; session aborted, previous weights kept");
  }
  std::string message = "bucket " + std::to_string(outcome.sequence) +
                        " received: " + std::to_string(request.tensors.size()) + " tensors, " +
                        std::to_string(outcome.bytes) + " bytes";
  if (sessionless_token) {
    std::lock_guard lock(ctx_.mu);
    ctx_.last_activity = comm::Clock::now();
    const auto open = ctx_.receiver.session();
    if (!open || open->id != ticket.session_id) {
      return error_reply(409,
                         "update_weights_from_distributed: the sessionless update was "
                         "aborted while it was received; previous weights kept");
    }
    auto committed = ctx_.commit_locked(sessionless_token);
    if (auto* failure = std::get_if<Reply>(&committed)) return *failure;
    message += " and committed to " + runner_list(std::get<Committed>(committed).runners) +
               std::get<Committed>(committed).flush_note;
  } else {
    ctx_.touch();
  }
  // SGLang's success message names the version the bucket carried.
  if (request.weight_version) {
    message += ". Weight version updated to " + *request.weight_version + ".";
  }
  return ok_reply(std::move(message));
}

Reply BucketRoutes::update_weights_from_tensor(const UpdateWeightsFromTensorRequest& request) {
  if (!ctx_.opts.colocate) {
    return error_reply(403,
                       "update_weights_from_tensor: this engine takes no colocated buckets "
                       "(started with --no-colocate); send them on a group");
  }
  std::size_t bytes = 0;
  try {
    bytes = ctx_.receiver.receive_segment(request);
  } catch (const ReceiverError& e) {
    return error_reply(e.status(), e.what());
  }
  ctx_.touch();
  std::string message =
      "bucket copied from the shared segment: " + std::to_string(request.tensors.size()) +
      " tensors, " + std::to_string(bytes) + " bytes staged";
  if (request.weight_version) {
    message += ". Weight version updated to " + *request.weight_version + ".";
  }
  return ok_reply(std::move(message));
}

}  // namespace weightcast::sync::engine

// Engine routes that touch the data plane: joining and leaving groups, receiving buckets.
#include <algorithm>
#include <variant>

#include "comm/errors.h"
#include "sync/engine/control/dialect.h"
#include "sync/engine/control/engine.h"
#include "sync/engine/runners/delta_base.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync::engine {

namespace {

Reply ok_basic(std::string message) {
  return {200, to_json_string(BasicResponse{true, std::move(message)})};
}

Reply refused_reply(const Refusal& refusal) {
  return error_reply(refusal.status, refusal.message);
}

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

}  // namespace

namespace {

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
          .rendezvous = request.rendezvous};
}

}  // namespace

Reply Engine::init_weights_update_group(const InitWeightsUpdateGroupRequest& request) {
  touch();
  const bool native = native_request(request);
  const std::string& name = request.group_name;
  if (auto refusal = refuse_init(opts_, request)) return in_dialect(native, *refusal);
  const GroupSpec spec = group_spec(request);
  // The receiver reserves the name, replaces an idle group of that name and joins, bounded by
  // --init-timeout-ms; the engine's lock is not held meanwhile.
  try {
    receiver_->join(spec);
  } catch (const ReceiverError& e) {
    touch();
    return in_dialect(
        native, error_reply(e.status(), std::string("init_weights_update_group: ") + e.what()));
  }
  touch();
  return ok_basic("joined group '" + name + "' as ranks " + std::to_string(spec.rank_offset) +
                  ".." + std::to_string(spec.rank_offset + opts_.rank_count - 1) + " of " +
                  std::to_string(spec.world_size));
}

Reply Engine::destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request) {
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  try {
    // SGLang's answer to an unknown group, word for word, in both dialects: a trainer that
    // destroys before it initializes (Miles) ignores it.
    receiver_->leave(request.group_name);
  } catch (const ReceiverError& e) {
    return error_reply(e.status(), e.what());
  }
  std::string note;
  // The receiver ended its session when the open session relied on the group.
  if (session_.in_session() && !receiver_->in_session()) {
    fail_session_locked(session_.session_id(),
                        "group '" + request.group_name + "' destroyed during the session",
                        /*abort_groups=*/false, 409);
    note = "; the open session was aborted and its staging discarded";
  }
  return ok_basic("left group '" + request.group_name + "'" + note);
}

std::variant<Refusal, Receiver::Ticket> Engine::submit_bucket_locked(
    const UpdateWeightsFromDistributedRequest& request, bool sessionless) {
  if (!session_.in_session()) {
    return Refusal{409, request.session_id
                            ? "update_weights_from_distributed: session_id '" +
                                  *request.session_id +
                                  "' is not open (ended, aborted or timed out)"
                            : std::string("update_weights_from_distributed: no session is open; "
                                          "call begin_weight_update first")};
  }
  // Inside a session a request without a selector takes the session's; a sessionless update's
  // session already has the scope its request's selector was narrowed to.
  const Selector selector =
      sessionless ? *session_.selector() : request.selector.value_or(*session_.selector());
  if (auto refusal = session_.check_payload(selector)) return *refusal;
  if (!sessionless) {
    if (auto refusal =
            session_.check_owner(request.session_id, "update_weights_from_distributed")) {
      return *refusal;
    }
  }
  last_activity_ = comm::Clock::now();
  // The receiver's session is the engine's, opened and ended with it; owners are checked here.
  UpdateWeightsFromDistributedRequest forwarded = request;
  forwarded.selector = selector;
  forwarded.session_id.reset();
  Receiver::Ticket ticket;
  try {
    ticket = receiver_->submit(forwarded);
  } catch (const ReceiverError& e) {
    return Refusal{e.status(), e.what()};
  }
  if (request.weight_version) session_.set_version(*request.weight_version);
  if (request.flush_cache) session_.request_flush();
  return ticket;
}

Reply Engine::update_weights_from_distributed(const UpdateWeightsFromDistributedRequest& request) {
  return in_dialect(native_request(request), receive_bucket(request));
}

std::optional<Refusal> Engine::open_sessionless_locked(
    const UpdateWeightsFromDistributedRequest& request) {
  if (auto refusal = lease_.check(std::nullopt, std::nullopt, "update_weights_from_distributed",
                                  std::chrono::steady_clock::now())) {
    return refusal;
  }
  auto scope = sessionless_scope(runners_->runners(), request.selector, opts_.sessionless);
  if (auto* refusal = std::get_if<Refusal>(&scope)) return *refusal;
  if (auto refusal =
          session_.begin(std::get<Selector>(scope), std::nullopt, /*sessionless=*/true)) {
    return refusal;
  }
  try {
    receiver_->begin(std::get<Selector>(scope));
  } catch (const ReceiverError& e) {
    session_.close();
    return Refusal{e.status(), e.what()};
  }
  session_start_ = std::chrono::steady_clock::now();
  return std::nullopt;
}

Reply Engine::receive_bucket(const UpdateWeightsFromDistributedRequest& request) {
  std::variant<Refusal, Receiver::Ticket> submitted;
  std::uint64_t engine_session = 0;
  // Held from the sessionless session's opening to its commit, so such updates apply one at a
  // time (slime and SGLang clients keep one request in flight anyway).
  std::unique_lock<std::timed_mutex> serial(sessionless_mu_, std::defer_lock);
  {
    std::unique_lock lock(mu_);
    // Native requests never open a sessionless update: one carrying a session id whose session
    // is gone must fail, not be applied on its own.
    if (!session_.in_session() && !native_request(request)) {
      lock.unlock();
      if (!serial.try_lock_for(opts_.comm_timeout)) {
        return error_reply(409,
                           "update_weights_from_distributed: another sessionless update "
                           "did not finish within " +
                               std::to_string(opts_.comm_timeout.count()) + " ms");
      }
      lock.lock();
      if (session_.in_session()) {
        serial.unlock();  // a session opened meanwhile: this request is its payload
      } else if (auto refusal = open_sessionless_locked(request)) {
        return refused_reply(*refusal);
      }
    }
    submitted = submit_bucket_locked(request, serial.owns_lock());
    engine_session = session_.session_id();
    if (std::holds_alternative<Refusal>(submitted) && serial.owns_lock()) {
      fail_session_locked(session_.session_id(), "refused", /*abort_groups=*/false, 400);
    }
  }
  if (auto* refusal = std::get_if<Refusal>(&submitted)) {
    return error_reply(refusal->status, refusal->message);
  }
  const Receiver::Ticket& ticket = std::get<Receiver::Ticket>(submitted);
  const std::uint64_t session_id = engine_session;
  const ReceiveOutcome outcome = receiver_->wait(ticket);
  if (outcome.failure) {
    const ReceiveFailure& f = *outcome.failure;
    // 409: the session was aborted by a request while this bucket was received; the group is
    // fine and the session already ended.
    if (f.stale) return error_reply(409, f.reason);
    // The receiver ended its session (and aborted a broken group); the engine's ends with it.
    std::lock_guard lock(mu_);
    last_activity_ = comm::Clock::now();
    fail_session_locked(session_id, f.reason, /*abort_groups=*/false, f.status);
    // A bucket received but not applicable (a delta whose base this engine does not hold, or a
    // bad payload) leaves the group; a broken group does not.
    return error_reply(f.status, std::string("update_weights_from_distributed") +
                                     (f.group_failed ? " failed: " : ": ") + f.reason +
                                     "; session aborted, previous weights kept");
  }
  const std::uint64_t sequence = outcome.sequence;
  std::string message = "bucket " + std::to_string(sequence) +
                        " received: " + std::to_string(request.tensors.size()) + " tensors, " +
                        std::to_string(outcome.bytes) + " bytes";
  if (serial.owns_lock()) {
    std::lock_guard lock(mu_);
    last_activity_ = comm::Clock::now();
    if (!session_.in_session() || session_.session_id() != session_id) {
      return error_reply(409,
                         "update_weights_from_distributed: the sessionless update was "
                         "aborted while it was received; previous weights kept");
    }
    auto committed = commit_locked();
    if (auto* failure = std::get_if<Reply>(&committed)) return *failure;
    message += " and committed to " + runner_list(std::get<Committed>(committed).runners) +
               std::get<Committed>(committed).flush_note;
  } else {
    touch();
  }
  // SGLang's success message names the version the bucket carried.
  if (request.weight_version) {
    message += ". Weight version updated to " + *request.weight_version + ".";
  }
  return ok_basic(std::move(message));
}

}  // namespace weightcast::sync::engine

// Engine routes that touch the data plane: joining and leaving groups, receiving buckets.
#include <algorithm>
#include <variant>

#include "comm/errors.h"
#include "sync/engine/delta_base.h"
#include "sync/engine/dialect.h"
#include "sync/engine/engine.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync::engine {

namespace {

Reply ok_basic(std::string message) {
  return {200, to_json_string(BasicResponse{true, std::move(message)})};
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
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
  if (request.rank_offset < 1) {
    return error_reply(400, "rank_offset: must be >= 1, group rank 0 is the source (got " +
                                std::to_string(request.rank_offset) + ")");
  }
  if (static_cast<std::int64_t>(request.rank_offset) + opts.rank_count > request.world_size) {
    return error_reply(400, "world_size: " + std::to_string(request.world_size) +
                                " leaves no room for this engine's " +
                                std::to_string(opts.rank_count) + " ranks at rank_offset " +
                                std::to_string(request.rank_offset));
  }
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

// Joins the group (bounded by --init-timeout-ms): the group, or the reply that says why not.
std::variant<Reply, std::shared_ptr<Group>> form_group(const EngineOptions& opts,
                                                       std::shared_ptr<BlockPool> pool,
                                                       const GroupSpec& spec) {
  ConnectOptions connect = opts.connect;
  connect.rank_count = opts.rank_count;
  connect.init_timeout = opts.init_timeout;
  try {
    auto channels = opts.connector(spec, connect);
    GroupOptions gopts;
    gopts.comm_timeout = opts.comm_timeout;
    gopts.max_ahead = opts.max_buckets_ahead;
    gopts.pool = std::move(pool);
    return std::make_shared<Group>(spec, std::move(channels), gopts);
  } catch (const comm::TimeoutError& e) {
    return error_reply(504, "init_weights_update_group: group '" + spec.group_name +
                                "' did not form within " +
                                std::to_string(opts.init_timeout.count()) + " ms: " + e.what());
  } catch (const comm::ConfigError& e) {
    return error_reply(400, std::string("init_weights_update_group: ") + e.what());
  } catch (const std::exception& e) {
    return error_reply(500, std::string("init_weights_update_group: ") + e.what());
  }
}

}  // namespace

std::optional<Reply> Engine::claim_group_name(const std::string& name) {
  std::shared_ptr<Group> old;
  {
    std::lock_guard lock(mu_);
    if (groups_.joining(name)) {
      return error_reply(409, "group_name: group '" + name + "' is already being joined");
    }
    // Re-init replaces a group (the recovery path), but not one the open session relies on.
    if (auto existing = groups_.find(name);
        existing &&
        (existing->busy() || (session_.in_session() && existing->used_in(session_.session_id())))) {
      return error_reply(
          409, "group_name: group '" + name + "' is in use by the open session; abort it first");
    }
    old = groups_.begin_join(name);
  }
  old.reset();  // aborts and joins the replaced group's threads
  return std::nullopt;
}

Reply Engine::init_weights_update_group(const InitWeightsUpdateGroupRequest& request) {
  touch();
  const bool native = native_request(request);
  const std::string& name = request.group_name;
  if (auto refusal = refuse_init(opts_, request)) return in_dialect(native, *refusal);
  if (auto refusal = claim_group_name(name)) return in_dialect(native, *refusal);
  const GroupSpec spec = group_spec(request);
  auto formed = form_group(opts_, runners_->block_pool(), spec);

  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  if (auto* failure = std::get_if<Reply>(&formed)) {
    groups_.end_join(name, nullptr);
    return in_dialect(native, *failure);
  }
  groups_.end_join(name, std::get<std::shared_ptr<Group>>(std::move(formed)));
  return ok_basic("joined group '" + name + "' as ranks " + std::to_string(spec.rank_offset) +
                  ".." + std::to_string(spec.rank_offset + opts_.rank_count - 1) + " of " +
                  std::to_string(spec.world_size));
}

Reply Engine::destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request) {
  std::shared_ptr<Group> group;
  std::string note;
  {
    std::lock_guard lock(mu_);
    last_activity_ = comm::Clock::now();
    group = groups_.find(request.group_name);
    if (!group) {
      // SGLang's answer, word for word, in both dialects: a trainer that destroys before it
      // initializes (Miles) ignores it.
      return error_reply(400, "The group to be destroyed does not exist.");
    }
    if (session_.in_session() && (group->busy() || group->used_in(session_.session_id()))) {
      fail_session_locked(session_.session_id(),
                          "group '" + request.group_name + "' destroyed during the session",
                          /*abort_groups=*/false, 409);
      note = "; the open session was aborted and its staging discarded";
    }
    groups_.remove(request.group_name);
  }
  group->abort(409, "group '" + request.group_name + "' destroyed");
  group.reset();
  return ok_basic("left group '" + request.group_name + "'" + note);
}

std::optional<Refusal> Engine::check_bucket_locked(
    const UpdateWeightsFromDistributedRequest& request, Selector selector,
    std::vector<std::vector<Runner>>& destinations) const {
  destinations.clear();
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorMeta& meta = request.tensors[i];
    const std::string field = "names[" + std::to_string(i) + "]";
    if (session_names_.count(meta.name)) {
      return Refusal{400, field + ": '" + meta.name + "' was already sent in this session"};
    }
    auto dest = runners_->destinations(selector, meta.name);
    for (Runner runner : dest) {
      auto resident = runners_->resident_meta(runner, meta.name);
      if (resident && (resident->dtype != meta.dtype || resident->shape != meta.shape)) {
        return Refusal{400, field + ": '" + meta.name + "' is " +
                                std::string(to_string(meta.dtype)) + shape_text(meta.shape) +
                                " but runner '" + std::string(to_string(runner)) + "' holds " +
                                std::string(to_string(resident->dtype)) +
                                shape_text(resident->shape)};
      }
    }
    destinations.push_back(std::move(dest));
  }
  return std::nullopt;
}

std::variant<Refusal, Engine::SubmittedBucket> Engine::submit_bucket_locked(
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
  std::shared_ptr<Group> group = groups_.find(request.group_name);
  if (!group) {
    return Refusal{409, "group_name: no group '" + request.group_name +
                            "' is joined; call init_weights_update_group first"};
  }
  SubmittedBucket out{nullptr, std::move(group), session_.session_id(), 0};
  std::vector<std::vector<Runner>> destinations;
  if (auto refusal = check_bucket_locked(request, selector, destinations)) return *refusal;
  out.sequence = groups_.sequence(request.group_name, out.session_id, request.sequence);
  auto planned = plan_bucket(request, out.sequence, opts_.max_bucket_bytes);
  if (auto* refusal = std::get_if<Refusal>(&planned)) return *refusal;
  BucketPlan plan = std::get<BucketPlan>(std::move(planned));
  std::shared_ptr<const DeltaSpec> delta;
  if (request.delta) {
    auto made = delta_spec_locked(*request.delta);
    if (auto* refusal = std::get_if<Refusal>(&made)) return *refusal;
    delta = std::get<std::shared_ptr<const DeltaSpec>>(std::move(made));
  }
  std::vector<Digest> expected;
  for (const auto& d : request.digests) expected.push_back(parse_digest(d, "digests"));
  out.job = std::make_shared<BucketJob>(out.session_id, std::move(plan), std::move(destinations),
                                        staging_, request.load_format == LoadFormat::kPerTensor,
                                        std::move(delta), std::move(expected));
  if (auto refusal = out.group->submit(out.job)) return *refusal;
  groups_.queued(request.group_name, out.sequence);
  for (const auto& meta : request.tensors) session_names_.insert(meta.name);
  if (request.weight_version) session_.set_version(*request.weight_version);
  if (request.flush_cache) session_.request_flush();
  return out;
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
  staging_ = std::make_shared<Staging>(opts_.rank_count);
  session_names_.clear();
  session_start_ = std::chrono::steady_clock::now();
  return std::nullopt;
}

Reply Engine::receive_bucket(const UpdateWeightsFromDistributedRequest& request) {
  std::variant<Refusal, SubmittedBucket> submitted;
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
    if (std::holds_alternative<Refusal>(submitted) && serial.owns_lock()) {
      fail_session_locked(session_.session_id(), "refused", /*abort_groups=*/false, 400);
    }
  }
  if (auto* refusal = std::get_if<Refusal>(&submitted)) {
    return error_reply(refusal->status, refusal->message);
  }
  const auto& [job, group, session_id, sequence] = std::get<SubmittedBucket>(submitted);
  // Bounded backstop: every step inside is bounded by the collective timeout per bucket.
  const auto budget = opts_.comm_timeout * static_cast<int>(opts_.max_buckets_ahead + 2);
  auto result = job->wait(comm::deadline_after(budget));
  if (!result) {
    return fail_bucket(session_id, group, 504,
                       "bucket " + std::to_string(sequence) + " not received within " +
                           std::to_string(budget.count()) + " ms");
  }
  // The bucket was received but could not be applied (a delta whose base this engine does not
  // hold, or a bad payload): the session ends, the group stays.
  if (result->session_failed) {
    std::lock_guard lock(mu_);
    fail_session_locked(session_id, result->message, /*abort_groups=*/false, result->status);
    return error_reply(result->status, "update_weights_from_distributed: " + result->message +
                                           "; session aborted, previous weights kept");
  }
  // 409: the session was aborted by a request while this bucket was received; the group is fine.
  if (result->status == 409) return error_reply(409, result->message);
  if (result->status != 200) return fail_bucket(session_id, group, result->status, result->message);
  std::string message = "bucket " + std::to_string(sequence) +
                        " received: " + std::to_string(request.tensors.size()) + " tensors, " +
                        std::to_string(job->plan().total_bytes) + " bytes";
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

std::variant<Refusal, std::shared_ptr<const DeltaSpec>> Engine::delta_spec_locked(
    const BucketDelta& delta) const {
  const std::string held = runners_->weight_version();
  if (delta.base_version != held) {
    return Refusal{409, "delta.base_version: the delta is against weight_version '" +
                            delta.base_version + "' but this engine holds '" + held +
                            "'; send the bucket in full"};
  }
  if (delta.wire_bytes > opts_.max_bucket_bytes) {
    return Refusal{400, "delta.wire_bytes: " + std::to_string(delta.wire_bytes) +
                            " over --max-bucket-bytes = " + std::to_string(opts_.max_bucket_bytes)};
  }
  std::vector<Digest> expected;
  try {
    for (const std::string& d : delta.base_digests) {
      expected.push_back(parse_digest(d, "delta.base_digests"));
    }
  } catch (const comm::BadRequestError& e) {
    return Refusal{400, e.what()};
  }
  auto spec = std::make_shared<DeltaSpec>();
  spec->codec = delta.codec;
  spec->wire_bytes = delta.wire_bytes;
  spec->fill_base =
      [runners = runners_.get(), expected = std::move(expected), base = delta.base_version](
          const BucketPlan& plan, const std::vector<std::vector<Runner>>& destinations,
          std::span<std::byte> bucket) {
        return fill_delta_base(*runners, plan, destinations, expected, base, bucket);
      };
  return std::shared_ptr<const DeltaSpec>(std::move(spec));
}

Reply Engine::fail_bucket(std::uint64_t session_id, const std::shared_ptr<Group>& group, int status,
                          const std::string& reason) {
  group->abort(status, reason);
  std::lock_guard lock(mu_);
  last_activity_ = comm::Clock::now();
  fail_session_locked(session_id, reason, /*abort_groups=*/false, status);
  return error_reply(status, "update_weights_from_distributed failed: " + reason +
                                 "; session aborted, previous weights kept");
}

}  // namespace weightcast::sync::engine

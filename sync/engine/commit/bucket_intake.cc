#include "sync/engine/commit/bucket_intake.h"

#include <utility>
#include <variant>

#include "sync/engine/commit/tensor_routes.h"

namespace weightcast::sync::engine {

namespace {

[[noreturn]] void refuse(const Refusal& refusal) {
  throw ReceiverError(refusal.status, refusal.message);
}

}  // namespace

BucketIntake::BucketIntake(IntakeOptions options, IntakeParts parts, ReceiverState& state)
    : opts_(std::move(options)),
      parts_(std::move(parts)),
      state_(state),
      mappings_({.keep = opts_.keep_segment_mappings}) {}

BucketIntake::Ticket BucketIntake::submit_locked(
    const UpdateWeightsFromDistributedRequest& request) {
  const Selector selector = state_.session.check_payload(request.session_id, request.selector,
                                                         "update_weights_from_distributed");
  Ticket out{nullptr, state_.groups.find(request.group_name),
             state_.session.machine().session_id()};
  // Another rank's slice (docs/sharding.md): answered without receiving.
  if (!out.group && state_.groups.elsewhere(request.group_name)) return out;
  if (!out.group) {
    throw ReceiverError(409, "group_name: no group '" + request.group_name +
                                 "' is joined; call init_weights_update_group first");
  }
  // A shard class's group: its ranks receive the slices their plan keeps.
  const ShardPlan* slices = parts_.ranks.plan_of(out.group->spec());
  const std::string shard_class =
      slices != nullptr ? "ranks " + std::to_string(out.group->spec().ranks.front()) : "";
  std::vector<std::vector<Runner>> destinations =
      destinations_locked(selector, request.tensors, slices, shard_class);
  const std::uint64_t sequence =
      state_.groups.sequence(request.group_name, out.session_id, request.sequence);
  auto planned = plan_bucket(request, sequence, opts_.max_bucket_bytes);
  if (auto* refusal = std::get_if<Refusal>(&planned)) throw ReceiverError(400, refusal->message);
  BucketPlan plan = std::get<BucketPlan>(std::move(planned));
  std::shared_ptr<const DeltaSpec> delta = delta_spec_locked(request, slices);
  out.job = std::make_shared<BucketJob>(out.session_id, std::move(plan), std::move(destinations),
                                        state_.session.staging(),
                                        request.load_format == LoadFormat::kPerTensor,
                                        std::move(delta), parse_expected_digests(request.digests));
  if (auto refusal = out.group->submit(out.job)) refuse(*refusal);
  state_.groups.queued(request.group_name, sequence);
  for (const auto& meta : request.tensors) state_.session.names(shard_class).insert(meta.name);
  if (request.weight_version) state_.session.machine().set_version(*request.weight_version);
  if (request.flush_cache) state_.session.machine().request_flush();
  return out;
}

std::shared_ptr<const DeltaSpec> BucketIntake::delta_spec_locked(
    const UpdateWeightsFromDistributedRequest& request, const ShardPlan* slices) {
  if (request.delta && state_.session.adapter()) {
    // An adapter's base is the adapter held under its name: immutable, so taken once here.
    const auto held = parts_.adapters.find(state_.session.adapter()->name);
    auto made = make_delta_spec(*request.delta, held ? held->version : std::string(),
                                held != nullptr, opts_.max_bucket_bytes, adapter_base_source(held));
    if (auto* refusal = std::get_if<Refusal>(&made)) {
      // Its versions are the adapter's, not the base weights'.
      refusal->message = "adapter '" + state_.session.adapter()->name + "': " + refusal->message;
      refuse(*refusal);
    }
    return std::get<std::shared_ptr<const DeltaSpec>>(std::move(made));
  }
  if (request.delta) {
    // The engine's own base (base_source), or the kept copy of the last committed tensors.
    DeltaBaseSource source = opts_.base_source;
    if (!source) {
      source = [this](const BucketPlan& bucket_plan, const std::vector<std::vector<Runner>>& dest,
                      const std::vector<Digest>& expected, const std::string&,
                      std::span<std::byte> bytes, const ShardPlan*) {
        std::lock_guard lock(state_.mu);
        return state_.base.fill(bucket_plan, dest, expected, bytes);
      };
    }
    auto made = make_delta_spec(*request.delta, parts_.version->get(),
                                opts_.base_source || state_.base.has_base(), opts_.max_bucket_bytes,
                                std::move(source), slices);
    if (auto* refusal = std::get_if<Refusal>(&made)) refuse(*refusal);
    return std::get<std::shared_ptr<const DeltaSpec>>(std::move(made));
  }
  return nullptr;
}

std::vector<std::vector<Runner>> BucketIntake::destinations_locked(
    Selector selector, const std::vector<TensorMeta>& tensors, const ShardPlan* slices,
    const std::string& shard_class) {
  if (const auto& adapter = state_.session.adapter()) {
    return route_adapter_tensors(*adapter, tensors, state_.session.names(shard_class));
  }
  return route_tensors(parts_.runners, parts_.ranks, selector, tensors,
                       state_.session.names(shard_class), state_.experts_dropped, slices);
}

std::size_t BucketIntake::receive_segment(const UpdateWeightsFromTensorRequest& request,
                                          const std::optional<std::string>& handle_token) {
  return stage_copied(request, handle_token, [&](const std::string& token) {
    return copy_segment(request, token, *parts_.pool, mappings_, opts_.comm_timeout,
                        opts_.cuda_device);
  });
}

std::size_t BucketIntake::receive_local(const UpdateWeightsFromTensorRequest& request,
                                        std::span<const std::byte> bytes) {
  return stage_copied(request, std::nullopt,
                      [&](const std::string&) { return copy_local(request, bytes, *parts_.pool); });
}

std::size_t BucketIntake::stage_copied(const UpdateWeightsFromTensorRequest& request,
                                       const std::optional<std::string>& handle_token,
                                       const CopyBucket& copy) {
  constexpr std::string_view kRoute = "update_weights_from_tensor";
  std::vector<std::vector<Runner>> destinations;
  std::uint64_t id = 0;
  std::string token;
  {
    std::lock_guard lock(state_.mu);
    const Selector selector =
        state_.session.check_payload(request.session_id, request.selector, kRoute);
    destinations = destinations_locked(selector, request.tensors);
    id = state_.session.machine().session_id();
    token = handle_token.value_or(state_.session.machine().token());
    state_.session.begin_copy(
        request.tensors);  // a commit waits for it, as for a bucket on a group
  }
  // Without the lock: the copy is bounded by the handle's wait and the bucket's size.
  std::vector<SegmentTensor> copied;
  try {
    copied = copy(token);
  } catch (...) {
    std::lock_guard lock(state_.mu);
    state_.session.end_copy(id, request.tensors, /*staged=*/false);
    throw;
  }
  std::lock_guard lock(state_.mu);
  if (!state_.session.end_copy(id, request.tensors, /*staged=*/true)) {
    throw ReceiverError(409, std::string(kRoute) +
                                 ": the session ended while the bucket was copied; nothing staged");
  }
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < copied.size(); ++i) {
    state_.bytes_copied += copied[i].bytes.size();
    if (!destinations[i].empty()) bytes += copied[i].bytes.size();
    for (Runner runner : destinations[i]) {
      // Whole tensors: every rank staged the same bytes (distinct staging keeps them once).
      for (int r = 0; r < parts_.ranks.count(); ++r) {
        state_.session.staging()->stage(
            runner, r, request.tensors[i],
            r == 0 || parts_.ranks.sliced() ? copied[i].bytes : SharedBytes(), copied[i].digest);
      }
    }
  }
  if (request.weight_version) state_.session.machine().set_version(*request.weight_version);
  if (request.flush_cache) state_.session.machine().request_flush();
  return bytes;
}

BucketIntake::Ticket BucketIntake::submit(const UpdateWeightsFromDistributedRequest& request) {
  std::lock_guard lock(state_.mu);
  return submit_locked(request);
}

ReceiveOutcome BucketIntake::wait(const Ticket& s) {
  ReceiveOutcome out;
  if (!s.job) return out;  // a group of other ranks: nothing to receive
  out.sequence = s.job->sequence();
  out.bytes = s.job->plan().total_bytes;
  // Bounded backstop: every step inside is bounded by the collective timeout per bucket.
  const auto budget = opts_.comm_timeout * static_cast<int>(opts_.max_buckets_ahead + 2);
  auto result = s.job->wait(comm::deadline_after(budget));
  if (!result) {
    result = JobResult{504, "bucket " + std::to_string(s.job->sequence()) +
                                " not received within " + std::to_string(budget.count()) + " ms"};
  }
  if (result->status == 200) return out;
  ReceiveFailure failure{result->status, result->message};
  // 409 without session_failed: the session was aborted meanwhile; the group is fine. A bucket
  // received but not applicable (session_failed) leaves the group fine too.
  failure.stale = !result->session_failed && result->status == 409;
  failure.group_failed = !result->session_failed && !failure.stale;
  if (failure.group_failed) s.group->abort(result->status, result->message);
  if (!failure.stale) {
    std::lock_guard lock(state_.mu);
    failure.ended_session =
        state_.fail_session_locked(s.session_id, false, result->status, result->message);
  }
  out.failure = std::move(failure);
  return out;
}

}  // namespace weightcast::sync::engine

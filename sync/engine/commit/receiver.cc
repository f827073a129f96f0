#include "sync/engine/commit/receiver.h"

#include <algorithm>
#include <variant>

#include "sync/engine/commit/tensor_routes.h"

namespace weightcast::sync::engine {

namespace {

[[noreturn]] void refuse(const Refusal& refusal) {
  throw ReceiverError(refusal.status, refusal.message);
}

}  // namespace

namespace {

LocalRanksOptions local_ranks_options(const ReceiverOptions& opts,
                                      std::shared_ptr<BlockPool> pool) {
  return {.place = opts.place,
          .init_timeout = opts.init_timeout,
          .comm_timeout = opts.comm_timeout,
          .max_buckets_ahead = opts.max_buckets_ahead,
          .connect = opts.connect,
          .connector = opts.connector,
          .group_connector = opts.group_connector,
          .pool = std::move(pool),
          .experts = opts.experts,
          .plans = opts.shard_plans};
}

}  // namespace

Receiver::Receiver(ReceiverOptions opts, std::vector<ReceiverRunner> runners)
    : opts_(std::move(opts)),
      runners_(std::move(runners)),
      pool_(opts_.pool ? opts_.pool : std::make_shared<BlockPool>()),
      mappings_({.keep = opts_.keep_segment_mappings}),
      ranks_(local_ranks_options(opts_, pool_)),
      session_(ranks_.count(), ranks_.sliced()),
      base_(opts_.keep_delta_base),
      version_(opts_.version ? opts_.version
                             : std::make_shared<WeightVersion>(opts_.initial_version)) {
  WC_ENFORCE(!(opts_.base_source && opts_.keep_delta_base),
             "a delta base source and a kept delta base exclude each other");
  WC_ENFORCE(!runners_.empty(), "a receiver needs at least one runner");
  // A kept base holds full tensors; a shard class's delta is against its slices, which the
  // engine's own base source cuts from the committed tensors (fill_delta_base).
  WC_ENFORCE(opts_.shard_plans.empty() || !opts_.keep_delta_base,
             "shard plans take deltas from a base source, not a kept delta base");
  for (std::size_t i = 0; i < runners_.size(); ++i) {
    WC_ENFORCE(static_cast<bool>(runners_[i].load), "runner '", to_string(runners_[i].id),
               "' has no load callback");
    for (std::size_t j = 0; j < i; ++j) {
      WC_ENFORCE(runners_[i].id != runners_[j].id, "runner '", to_string(runners_[i].id),
                 "' given twice");
    }
  }
}

Receiver::~Receiver() {
  GroupTable::Groups groups;
  {
    std::lock_guard lock(mu_);
    groups = groups_.take_all();
    if (session_.staging()) session_.staging()->discard();
  }
  groups.clear();  // each Group aborts and joins its threads, without our lock
}

const ReceiverRunner* Receiver::find(Runner id) const {
  for (const auto& r : runners_) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

std::vector<Runner> Receiver::runners() const {
  std::vector<Runner> out;
  for (Runner id : kAllRunners) {
    if (find(id)) out.push_back(id);
  }
  return out;
}

const NameFilter& Receiver::filter(Runner runner) const {
  const ReceiverRunner* r = find(runner);
  WC_ENFORCE(r != nullptr, "no runner '", to_string(runner), "'");
  return r->filter;
}

void Receiver::join(const GroupSpec& spec) {
  std::shared_ptr<Group> old;
  {
    std::lock_guard lock(mu_);
    if (groups_.joining(spec.group_name)) {
      throw ReceiverError(409,
                          "group_name: group '" + spec.group_name + "' is already being joined");
    }
    // Re-init replaces a group (the recovery path), but not one the open session relies on.
    if (auto g = groups_.find(spec.group_name);
        g && (g->busy() ||
              (session_.machine().in_session() && g->used_in(session_.machine().session_id())))) {
      throw ReceiverError(409, "group_name: group '" + spec.group_name +
                                   "' is in use by the open session; abort it first");
    }
    old = groups_.begin_join(spec.group_name);
    if (!ranks_.joins(spec)) {
      // A class group of ranks this receiver does not serve (docs/sharding.md).
      groups_.end_join(spec.group_name, nullptr);
      groups_.mark_elsewhere(spec.group_name);
    }
  }
  old.reset();  // aborts and joins the replaced group's threads
  if (!ranks_.joins(spec)) return;
  std::shared_ptr<Group> group;
  try {
    group = ranks_.form(spec);
  } catch (...) {
    std::lock_guard lock(mu_);
    groups_.end_join(spec.group_name, nullptr);
    throw;
  }
  std::lock_guard lock(mu_);
  groups_.end_join(spec.group_name, std::move(group));
}

bool Receiver::leave(const std::string& group_name) {
  std::shared_ptr<Group> group;
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    group = groups_.find(group_name);
    if (!group && groups_.elsewhere(group_name)) {
      groups_.remove(group_name);
      return false;
    }
    if (!group) throw ReceiverError(400, "The group to be destroyed does not exist.");
    if (session_.machine().in_session() &&
        (group->busy() || group->used_in(session_.machine().session_id()))) {
      ended = fail_session_locked(session_.machine().session_id(), false, 409,
                                  "group '" + group_name + "' left during the session");
    }
    groups_.remove(group_name);
  }
  group->abort(409, "group '" + group_name + "' left");
  return ended;
}

std::vector<std::string> Receiver::groups() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, group] : groups_.all()) out.push_back(name);
  return out;
}

ReceiverBegin Receiver::begin(Selector selector, std::optional<std::string> holder,
                              bool sessionless, std::optional<AdapterTarget> adapter) {
  std::lock_guard lock(mu_);
  const std::string name = adapter ? adapter->name : std::string();
  session_.begin(selector, std::move(holder), sessionless, std::move(adapter));
  ReceiverBegin out{
      session_.machine().token(), version_->get(), base_.held_digest(selector), {}, {}};
  if (const auto held = name.empty() ? nullptr : adapters_.find(name)) {
    out.lora_version = held->version;
    out.lora_digest = to_string(held->combined_digest());
  }
  return out;
}

std::optional<SessionView> Receiver::session() const {
  std::lock_guard lock(mu_);
  if (!session_.machine().in_session()) return std::nullopt;
  return SessionView{session_.machine().session_id(), *session_.machine().selector(),
                     session_.machine().owned(), session_.machine().sessionless(),
                     session_.machine().holder_text()};
}

bool Receiver::sessionless() const {
  std::lock_guard lock(mu_);
  return session_.machine().in_session() && session_.machine().sessionless();
}

bool Receiver::paused() const {
  std::lock_guard lock(mu_);
  return session_.machine().paused();
}

void Receiver::set_paused(bool paused) {
  std::lock_guard lock(mu_);
  session_.machine().set_paused(paused);
}

std::optional<Refusal> Receiver::check_owner(const std::optional<std::string>& token,
                                             std::string_view route) const {
  std::lock_guard lock(mu_);
  return session_.machine().check_owner(token, route);
}

bool Receiver::abort_session(std::uint64_t id, const std::string& reason, int status,
                             bool abort_used_groups) {
  std::lock_guard lock(mu_);
  return fail_session_locked(id, true, status, reason, abort_used_groups);
}

bool Receiver::fail_session_locked(std::uint64_t session_id, bool abort_busy_groups, int status,
                                   const std::string& reason, bool abort_used_groups) {
  if (!session_.discard(session_id)) return false;
  // A group left half-way through a broadcast cannot be reused: its peers are out of step.
  for (auto& [name, group] : groups_.all()) {
    if ((abort_busy_groups && group->busy()) || (abort_used_groups && group->used_in(session_id))) {
      group->abort(status, "session failed: " + reason);
    }
  }
  return true;
}

void Receiver::abort(const std::string& reason, int status, bool abort_used_groups) {
  std::lock_guard lock(mu_);
  if (session_.machine().in_session()) {
    fail_session_locked(session_.machine().session_id(), true, status, reason, abort_used_groups);
  }
}

void Receiver::abort_groups(int status, const std::string& reason) {
  std::lock_guard lock(mu_);
  for (auto& [name, group] : groups_.all()) group->abort(status, reason);
}

bool Receiver::busy() const {
  std::lock_guard lock(mu_);
  return groups_.any_busy() || session_.copying();
}

GroupTable::Groups Receiver::joined() const {
  std::lock_guard lock(mu_);
  return groups_.all();
}

Receiver::Ticket Receiver::submit_locked(const UpdateWeightsFromDistributedRequest& request) {
  const Selector selector = session_.check_payload(request.session_id, request.selector,
                                                   "update_weights_from_distributed");
  Ticket out{nullptr, groups_.find(request.group_name), session_.machine().session_id()};
  // Another rank's slice (docs/sharding.md): answered without receiving.
  if (!out.group && groups_.elsewhere(request.group_name)) return out;
  if (!out.group) {
    throw ReceiverError(409, "group_name: no group '" + request.group_name +
                                 "' is joined; call init_weights_update_group first");
  }
  // A shard class's group: its ranks receive the slices their plan keeps.
  const ShardPlan* slices = ranks_.plan_of(out.group->spec());
  const std::string shard_class =
      slices != nullptr ? "ranks " + std::to_string(out.group->spec().ranks.front()) : "";
  std::vector<std::vector<Runner>> destinations =
      destinations_locked(selector, request.tensors, slices, shard_class);
  const std::uint64_t sequence =
      groups_.sequence(request.group_name, out.session_id, request.sequence);
  auto planned = plan_bucket(request, sequence, opts_.max_bucket_bytes);
  if (auto* refusal = std::get_if<Refusal>(&planned)) throw ReceiverError(400, refusal->message);
  BucketPlan plan = std::get<BucketPlan>(std::move(planned));
  std::shared_ptr<const DeltaSpec> delta;
  if (request.delta && session_.adapter()) {
    // An adapter's base is the adapter held under its name: immutable, so taken once here.
    const auto held = adapters_.find(session_.adapter()->name);
    auto made = make_delta_spec(*request.delta, held ? held->version : std::string(),
                                held != nullptr, opts_.max_bucket_bytes, adapter_base_source(held));
    if (auto* refusal = std::get_if<Refusal>(&made)) {
      // Its versions are the adapter's, not the base weights'.
      refusal->message = "adapter '" + session_.adapter()->name + "': " + refusal->message;
      refuse(*refusal);
    }
    delta = std::get<std::shared_ptr<const DeltaSpec>>(std::move(made));
  } else if (request.delta) {
    // The engine's own base (base_source), or the kept copy of the last committed tensors.
    DeltaBaseSource source = opts_.base_source;
    if (!source) {
      source = [this](const BucketPlan& bucket_plan, const std::vector<std::vector<Runner>>& dest,
                      const std::vector<Digest>& expected, const std::string&,
                      std::span<std::byte> bytes, const ShardPlan*) {
        std::lock_guard lock(mu_);
        return base_.fill(bucket_plan, dest, expected, bytes);
      };
    }
    auto made =
        make_delta_spec(*request.delta, version_->get(), opts_.base_source || base_.has_base(),
                        opts_.max_bucket_bytes, std::move(source), slices);
    if (auto* refusal = std::get_if<Refusal>(&made)) refuse(*refusal);
    delta = std::get<std::shared_ptr<const DeltaSpec>>(std::move(made));
  }
  out.job =
      std::make_shared<BucketJob>(out.session_id, std::move(plan), std::move(destinations),
                                  session_.staging(), request.load_format == LoadFormat::kPerTensor,
                                  std::move(delta), parse_expected_digests(request.digests));
  if (auto refusal = out.group->submit(out.job)) refuse(*refusal);
  groups_.queued(request.group_name, sequence);
  for (const auto& meta : request.tensors) session_.names(shard_class).insert(meta.name);
  if (request.weight_version) session_.machine().set_version(*request.weight_version);
  if (request.flush_cache) session_.machine().request_flush();
  return out;
}

std::vector<std::vector<Runner>> Receiver::destinations_locked(
    Selector selector, const std::vector<TensorMeta>& tensors, const ShardPlan* slices,
    const std::string& shard_class) {
  if (const auto& adapter = session_.adapter()) {
    return route_adapter_tensors(*adapter, tensors, session_.names(shard_class));
  }
  return route_tensors(runners_, ranks_, selector, tensors, session_.names(shard_class),
                       experts_dropped_, slices);
}

void Receiver::check_staged(std::map<Runner, std::map<std::string, StagedTensor>>& staged) const {
  ranks_.verify(
      staged, opts_.verify_at_commit,
      [this](Runner id, const std::string& name) -> std::optional<std::vector<std::int64_t>> {
        const ReceiverRunner* r = find(id);
        if (r == nullptr || !r->shape_of) return std::nullopt;
        return r->shape_of(name);
      });
}

std::size_t Receiver::receive_segment(const UpdateWeightsFromTensorRequest& request,
                                      const std::optional<std::string>& handle_token) {
  return stage_copied(request, handle_token, [&](const std::string& token) {
    return copy_segment(request, token, *pool_, mappings_, opts_.comm_timeout);
  });
}

std::size_t Receiver::receive_local(const UpdateWeightsFromTensorRequest& request,
                                    std::span<const std::byte> bytes) {
  return stage_copied(request, std::nullopt,
                      [&](const std::string&) { return copy_local(request, bytes, *pool_); });
}

std::size_t Receiver::stage_copied(const UpdateWeightsFromTensorRequest& request,
                                   const std::optional<std::string>& handle_token,
                                   const CopyBucket& copy) {
  constexpr std::string_view kRoute = "update_weights_from_tensor";
  std::vector<std::vector<Runner>> destinations;
  std::uint64_t id = 0;
  std::string token;
  {
    std::lock_guard lock(mu_);
    const Selector selector = session_.check_payload(request.session_id, request.selector, kRoute);
    destinations = destinations_locked(selector, request.tensors);
    id = session_.machine().session_id();
    token = handle_token.value_or(session_.machine().token());
    session_.begin_copy(request.tensors);  // a commit waits for it, as for a bucket on a group
  }
  // Without the lock: the copy is bounded by the handle's wait and the bucket's size.
  std::vector<SegmentTensor> copied;
  try {
    copied = copy(token);
  } catch (...) {
    std::lock_guard lock(mu_);
    session_.end_copy(id, request.tensors, /*staged=*/false);
    throw;
  }
  std::lock_guard lock(mu_);
  if (!session_.end_copy(id, request.tensors, /*staged=*/true)) {
    throw ReceiverError(409, std::string(kRoute) +
                                 ": the session ended while the bucket was copied; nothing staged");
  }
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < copied.size(); ++i) {
    bytes_copied_ += copied[i].bytes.size();
    if (!destinations[i].empty()) bytes += copied[i].bytes.size();
    for (Runner runner : destinations[i]) {
      // Whole tensors: every rank staged the same bytes (distinct staging keeps them once).
      for (int r = 0; r < ranks_.count(); ++r) {
        session_.staging()->stage(runner, r, request.tensors[i],
                                  r == 0 || ranks_.sliced() ? copied[i].bytes : SharedBytes(),
                                  copied[i].digest);
      }
    }
  }
  if (request.weight_version) session_.machine().set_version(*request.weight_version);
  if (request.flush_cache) session_.machine().request_flush();
  return bytes;
}

std::size_t Receiver::receive(const UpdateWeightsFromDistributedRequest& request) {
  ReceiveOutcome outcome = wait(submit(request));
  if (!outcome.failure) return outcome.bytes;
  if (outcome.failure->stale) throw ReceiverError(409, outcome.failure->reason);
  throw ReceiverError(outcome.failure->status, "receive: " + outcome.failure->reason +
                                                   "; session aborted, previous weights kept");
}

Receiver::Ticket Receiver::submit(const UpdateWeightsFromDistributedRequest& request) {
  std::lock_guard lock(mu_);
  return submit_locked(request);
}

ReceiveOutcome Receiver::wait(const Ticket& s) {
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
    std::lock_guard lock(mu_);
    failure.ended_session =
        fail_session_locked(s.session_id, false, result->status, result->message);
  }
  out.failure = std::move(failure);
  return out;
}

bool Receiver::set_version(const std::string& version,
                           const std::optional<std::string>& session_id) {
  constexpr std::string_view kRoute = "update_weight_version";
  std::lock_guard lock(mu_);
  if (auto refusal = session_.machine().check_owner(session_id, kRoute)) refuse(*refusal);
  if (session_id) {
    if (auto refusal = session_.machine().check_open(session_id, kRoute)) refuse(*refusal);
  }
  if (!session_.machine().set_version(version)) return false;
  version_->set(version);
  return true;
}

ReceiverCommit Receiver::commit(const std::optional<std::string>& version,
                                const std::optional<std::string>& session_id,
                                const PublishFn& publish) {
  std::lock_guard commit_lock(commit_mu_);
  SessionTaken taken;
  {
    std::lock_guard lock(mu_);
    session_.check_end(session_id);
    for (const auto& [name, group] : groups_.all()) {
      if (group->busy()) {
        throw ReceiverError(409, "end_weight_update: buckets of group '" + name +
                                     "' are still in flight; wait for their responses");
      }
    }
    taken = session_.take(runners_, version);
  }
  struct Done {
    Receiver* self;
    ~Done() {
      std::lock_guard lock(self->mu_);
      self->session_.committed();
    }
  } done{this};
  if (taken.adapter) return commit_adapter(taken);
  auto& staged = taken.staged;
  const Selector selector = taken.selector;
  const std::optional<std::string>& next_version = taken.version;
  check_staged(staged);
  ReceiverCommit out;
  out.runners = load_staged(runners_, staged, base_);
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, tensors] : staged) {
      out.bytes_loaded += base_.record_in_order(id, tensors, [](const auto& entry) {
        const StagedTensor& t = entry.second;
        return std::tie(t.meta, t.bytes, *t.rank_digests[0]);
      });
    }
    if (next_version && !publish) version_->set(*next_version);
    out.runner_digest = base_.held_digest(selector);
  }
  // Since it cannot fail: runners that keep what they are handed take it whole.
  hand_over(runners_, staged);
  if (publish) publish(selector, next_version);
  out.selector = selector;
  out.flush_requested = taken.flush;
  out.weight_version = version_->get();
  return out;
}

// An adapter session's commit: every rank's copies checked, one adapter built and swapped in
// under its name; no runner loads, the base weights and their version stay as they are.
ReceiverCommit Receiver::commit_adapter(SessionTaken& taken) {
  check_staged(taken.staged);
  auto adapter = build_adapter(*taken.adapter, taken.staged[Runner::kTarget], find(Runner::kTarget),
                               taken.version.value_or(""));
  adapters_.put(adapter, taken.adapter->put);
  ReceiverCommit out;
  out.selector = Selector::kTarget;
  out.adapter = adapter->name;
  out.lora_digest = to_string(adapter->combined_digest());
  out.bytes_loaded = adapter->byte_count();
  out.weight_version = version_->get();
  return out;
}

void Receiver::install(Runner id, const std::vector<TensorMeta>& metas,
                       const std::vector<std::span<const std::byte>>& bytes) {
  WC_ENFORCE_EQ(metas.size(), bytes.size(), "install: one byte span per tensor");
  const ReceiverRunner* runner = find(id);
  WC_ENFORCE(runner != nullptr, "install: no runner '", to_string(id), "'");
  std::lock_guard commit_lock(commit_mu_);
  {
    std::lock_guard lock(mu_);
    if (session_.machine().in_session()) throw ReceiverError(409, "install: a session is open");
  }
  std::vector<TensorView> views;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    WC_ENFORCE_EQ(bytes[i].size(), metas[i].byte_count(), "install: bytes of '", metas[i].name,
                  "'");
    views.push_back({&metas[i], bytes[i]});
  }
  load_views(*runner, views);
  // The staging pool, pre-faulted for one full update of what was installed (as
  // weightcast-engine does at start): no update then pays page faults for fresh memory.
  std::size_t total = 0;
  for (const auto& b : bytes)
    total += (b.size() + kDefaultBucketAlignment - 1) / kDefaultBucketAlignment *
             kDefaultBucketAlignment;
  pool_->reserve(total + total / 64 + (std::size_t{4} << 20));
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const SharedBytes held = base_.keeps_bytes() ? SharedBytes::copy_of(bytes[i]) : SharedBytes();
    base_.record(id, metas[i], held, tensor_digest(bytes[i]));
  }
}

bool Receiver::in_session() const {
  std::lock_guard lock(mu_);
  return session_.machine().in_session();
}

std::optional<Selector> Receiver::session_selector() const {
  std::lock_guard lock(mu_);
  return session_.machine().selector();
}

std::string Receiver::weight_version() const {
  return version_->get();
}

void Receiver::set_keep_delta_base(bool keep) {
  std::lock_guard commit_lock(commit_mu_);
  std::lock_guard lock(mu_);
  base_.set_keep_bytes(keep);
}

bool Receiver::keeps_delta_base() const {
  std::lock_guard lock(mu_);
  return base_.keeps_bytes();
}

std::size_t Receiver::delta_base_bytes() const {
  std::lock_guard lock(mu_);
  return base_.bytes();
}

std::map<std::string, Digest> Receiver::digests(Runner runner) const {
  std::lock_guard lock(mu_);
  return base_.digests(runner);
}

std::uint64_t Receiver::experts_dropped() const {
  std::lock_guard lock(mu_);
  return experts_dropped_;
}

std::uint64_t Receiver::bytes_received() const {
  std::lock_guard lock(mu_);
  return groups_.bytes_received() + bytes_copied_;
}

}  // namespace weightcast::sync::engine

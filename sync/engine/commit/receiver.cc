#include "sync/engine/commit/receiver.h"

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
      ranks_(local_ranks_options(opts_, pool_)),
      state_(ranks_.count(), ranks_.sliced(), opts_.keep_delta_base),
      version_(opts_.version ? opts_.version
                             : std::make_shared<WeightVersion>(opts_.initial_version)),
      intake_({.comm_timeout = opts_.comm_timeout,
               .max_bucket_bytes = opts_.max_bucket_bytes,
               .max_buckets_ahead = opts_.max_buckets_ahead,
               .base_source = opts_.base_source,
               .keep_segment_mappings = opts_.keep_segment_mappings,
               // Engine rank 0's GPU (all ranks at once), or this rank's own (-1: current).
               .cuda_device =
                   opts_.group_connector ? opts_.connect.base_gpu_id : opts_.place.cuda_device},
              {runners_, ranks_, pool_, version_, adapters_}, state_) {
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
    std::lock_guard lock(state_.mu);
    groups = state_.groups.take_all();
    if (state_.session.staging()) state_.session.staging()->discard();
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
    std::lock_guard lock(state_.mu);
    if (state_.groups.joining(spec.group_name)) {
      throw ReceiverError(409,
                          "group_name: group '" + spec.group_name + "' is already being joined");
    }
    // Re-init replaces a group (the recovery path), but not one the open session relies on.
    if (auto g = state_.groups.find(spec.group_name);
        g && (g->busy() || (state_.session.machine().in_session() &&
                            g->used_in(state_.session.machine().session_id())))) {
      throw ReceiverError(409, "group_name: group '" + spec.group_name +
                                   "' is in use by the open session; abort it first");
    }
    old = state_.groups.begin_join(spec.group_name);
    if (!ranks_.joins(spec)) {
      // A class group of ranks this receiver does not serve (docs/sharding.md).
      state_.groups.end_join(spec.group_name, nullptr);
      state_.groups.mark_elsewhere(spec.group_name);
    }
  }
  old.reset();  // aborts and joins the replaced group's threads
  if (!ranks_.joins(spec)) return;
  std::shared_ptr<Group> group;
  try {
    group = ranks_.form(spec);
  } catch (...) {
    std::lock_guard lock(state_.mu);
    state_.groups.end_join(spec.group_name, nullptr);
    throw;
  }
  std::lock_guard lock(state_.mu);
  state_.groups.end_join(spec.group_name, std::move(group));
}

bool Receiver::leave(const std::string& group_name) {
  std::shared_ptr<Group> group;
  bool ended = false;
  {
    std::lock_guard lock(state_.mu);
    group = state_.groups.find(group_name);
    if (!group && state_.groups.elsewhere(group_name)) {
      state_.groups.remove(group_name);
      return false;
    }
    if (!group) throw ReceiverError(400, "The group to be destroyed does not exist.");
    if (state_.session.machine().in_session() &&
        (group->busy() || group->used_in(state_.session.machine().session_id()))) {
      ended = state_.fail_session_locked(state_.session.machine().session_id(), false, 409,
                                         "group '" + group_name + "' left during the session");
    }
    state_.groups.remove(group_name);
  }
  group->abort(409, "group '" + group_name + "' left");
  return ended;
}

std::vector<std::string> Receiver::groups() const {
  std::lock_guard lock(state_.mu);
  std::vector<std::string> out;
  for (const auto& [name, group] : state_.groups.all()) out.push_back(name);
  return out;
}

ReceiverBegin Receiver::begin(Selector selector, std::optional<std::string> holder,
                              bool sessionless, std::optional<AdapterTarget> adapter) {
  std::lock_guard lock(state_.mu);
  const std::string name = adapter ? adapter->name : std::string();
  state_.session.begin(selector, std::move(holder), sessionless, std::move(adapter));
  ReceiverBegin out{
      state_.session.machine().token(), version_->get(), state_.base.held_digest(selector), {}, {}};
  if (const auto held = name.empty() ? nullptr : adapters_.find(name)) {
    out.lora_version = held->version;
    out.lora_digest = to_string(held->combined_digest());
  }
  return out;
}

std::optional<SessionView> Receiver::session() const {
  std::lock_guard lock(state_.mu);
  if (!state_.session.machine().in_session()) return std::nullopt;
  return SessionView{state_.session.machine().session_id(), *state_.session.machine().selector(),
                     state_.session.machine().owned(), state_.session.machine().sessionless(),
                     state_.session.machine().holder_text()};
}

bool Receiver::sessionless() const {
  std::lock_guard lock(state_.mu);
  return state_.session.machine().in_session() && state_.session.machine().sessionless();
}

bool Receiver::paused() const {
  std::lock_guard lock(state_.mu);
  return state_.session.machine().paused();
}

void Receiver::set_paused(bool paused) {
  std::lock_guard lock(state_.mu);
  state_.session.machine().set_paused(paused);
}

std::optional<Refusal> Receiver::check_owner(const std::optional<std::string>& token,
                                             std::string_view route) const {
  std::lock_guard lock(state_.mu);
  return state_.session.machine().check_owner(token, route);
}

bool Receiver::abort_session(std::uint64_t id, const std::string& reason, int status,
                             bool abort_used_groups) {
  std::lock_guard lock(state_.mu);
  return state_.fail_session_locked(id, true, status, reason, abort_used_groups);
}

void Receiver::abort(const std::string& reason, int status, bool abort_used_groups) {
  std::lock_guard lock(state_.mu);
  if (state_.session.machine().in_session()) {
    state_.fail_session_locked(state_.session.machine().session_id(), true, status, reason,
                               abort_used_groups);
  }
}

void Receiver::abort_groups(int status, const std::string& reason) {
  std::lock_guard lock(state_.mu);
  for (auto& [name, group] : state_.groups.all()) group->abort(status, reason);
}

bool Receiver::busy() const {
  std::lock_guard lock(state_.mu);
  return state_.groups.any_busy() || state_.session.copying();
}

GroupTable::Groups Receiver::joined() const {
  std::lock_guard lock(state_.mu);
  return state_.groups.all();
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
  return intake_.receive_segment(request, handle_token);
}

std::size_t Receiver::receive_local(const UpdateWeightsFromTensorRequest& request,
                                    std::span<const std::byte> bytes) {
  return intake_.receive_local(request, bytes);
}

std::size_t Receiver::receive(const UpdateWeightsFromDistributedRequest& request) {
  ReceiveOutcome outcome = wait(submit(request));
  if (!outcome.failure) return outcome.bytes;
  if (outcome.failure->stale) throw ReceiverError(409, outcome.failure->reason);
  throw ReceiverError(outcome.failure->status, "receive: " + outcome.failure->reason +
                                                   "; session aborted, previous weights kept");
}

Receiver::Ticket Receiver::submit(const UpdateWeightsFromDistributedRequest& request) {
  return intake_.submit(request);
}

ReceiveOutcome Receiver::wait(const Ticket& ticket) {
  return intake_.wait(ticket);
}

bool Receiver::set_version(const std::string& version,
                           const std::optional<std::string>& session_id) {
  constexpr std::string_view kRoute = "update_weight_version";
  std::lock_guard lock(state_.mu);
  if (auto refusal = state_.session.machine().check_owner(session_id, kRoute)) refuse(*refusal);
  if (session_id) {
    if (auto refusal = state_.session.machine().check_open(session_id, kRoute)) refuse(*refusal);
  }
  if (!state_.session.machine().set_version(version)) return false;
  version_->set(version);
  return true;
}

ReceiverCommit Receiver::commit(const std::optional<std::string>& version,
                                const std::optional<std::string>& session_id,
                                const PublishFn& publish) {
  std::lock_guard commit_lock(commit_mu_);
  SessionTaken taken;
  {
    std::lock_guard lock(state_.mu);
    state_.session.check_end(session_id);
    for (const auto& [name, group] : state_.groups.all()) {
      if (group->busy()) {
        throw ReceiverError(409, "end_weight_update: buckets of group '" + name +
                                     "' are still in flight; wait for their responses");
      }
    }
    taken = state_.session.take(runners_, version);
  }
  struct Done {
    Receiver* self;
    ~Done() {
      std::lock_guard lock(self->state_.mu);
      self->state_.session.committed();
    }
  } done{this};
  if (taken.adapter) return commit_adapter(taken);
  auto& staged = taken.staged;
  const Selector selector = taken.selector;
  const std::optional<std::string>& next_version = taken.version;
  check_staged(staged);
  ReceiverCommit out;
  out.runners = load_staged(runners_, staged, state_.base);
  {
    std::lock_guard lock(state_.mu);
    for (const auto& [id, tensors] : staged) {
      out.bytes_loaded += state_.base.record_in_order(id, tensors, [](const auto& entry) {
        const StagedTensor& t = entry.second;
        return std::tie(t.meta, t.bytes, *t.rank_digests[0]);
      });
    }
    if (next_version && !publish) version_->set(*next_version);
    out.runner_digest = state_.base.held_digest(selector);
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
    std::lock_guard lock(state_.mu);
    if (state_.session.machine().in_session())
      throw ReceiverError(409, "install: a session is open");
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
  std::lock_guard lock(state_.mu);
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const SharedBytes held =
        state_.base.keeps_bytes() ? SharedBytes::copy_of(bytes[i]) : SharedBytes();
    state_.base.record(id, metas[i], held, tensor_digest(bytes[i]));
  }
}

bool Receiver::in_session() const {
  std::lock_guard lock(state_.mu);
  return state_.session.machine().in_session();
}

std::optional<Selector> Receiver::session_selector() const {
  std::lock_guard lock(state_.mu);
  return state_.session.machine().selector();
}

std::string Receiver::weight_version() const {
  return version_->get();
}

void Receiver::set_keep_delta_base(bool keep) {
  std::lock_guard commit_lock(commit_mu_);
  std::lock_guard lock(state_.mu);
  state_.base.set_keep_bytes(keep);
}

bool Receiver::keeps_delta_base() const {
  std::lock_guard lock(state_.mu);
  return state_.base.keeps_bytes();
}

std::size_t Receiver::delta_base_bytes() const {
  std::lock_guard lock(state_.mu);
  return state_.base.bytes();
}

std::map<std::string, Digest> Receiver::digests(Runner runner) const {
  std::lock_guard lock(state_.mu);
  return state_.base.digests(runner);
}

std::uint64_t Receiver::experts_dropped() const {
  std::lock_guard lock(state_.mu);
  return state_.experts_dropped;
}

std::uint64_t Receiver::bytes_received() const {
  std::lock_guard lock(state_.mu);
  return state_.groups.bytes_received() + state_.bytes_copied;
}

}  // namespace weightcast::sync::engine

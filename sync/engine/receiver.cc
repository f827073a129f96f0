#include "sync/engine/receiver.h"

#include <algorithm>
#include <variant>

#include "sync/engine/rendezvous.h"

namespace weightcast::sync::engine {

namespace {

[[noreturn]] void refuse(const Refusal& refusal) {
  throw ReceiverError(refusal.status, refusal.message);
}

int join_status(const std::exception& e) {
  if (dynamic_cast<const comm::TimeoutError*>(&e)) return 504;
  if (dynamic_cast<const comm::ConfigError*>(&e)) return 400;
  return 500;
}

}  // namespace

std::unique_ptr<BucketChannel> connect_rank(const GroupSpec& spec, const ConnectOptions& opts,
                                            int engine_rank) {
  const comm::Deadline deadline = comm::deadline_after(opts.init_timeout);
  const RendezvousPlan plan = detect_rendezvous(spec, opts, deadline);
  return make_comm_channel(join_rank(spec, opts, plan, engine_rank, deadline));
}

Receiver::Receiver(ReceiverOptions opts, std::vector<ReceiverRunner> runners)
    : opts_(std::move(opts)),
      runners_(std::move(runners)),
      base_(opts_.keep_delta_base),
      version_(opts_.initial_version) {
  const ReceiverPlace& p = opts_.place;
  WC_ENFORCE_GT(p.rank_count, 0, "engine rank count");
  WC_ENFORCE(p.engine_rank >= 0 && p.engine_rank < p.rank_count, "engine rank ", p.engine_rank,
             " of ", p.rank_count);
  WC_ENFORCE(p.cuda_device >= -1, "cuda_device: -1 (host) or a CUDA ordinal");
  WC_ENFORCE_GT(opts_.comm_timeout.count(), 0);
  WC_ENFORCE_GT(opts_.init_timeout.count(), 0);
  WC_ENFORCE_GT(opts_.max_buckets_ahead, std::uint64_t{0});
  WC_ENFORCE(static_cast<bool>(opts_.connector), "a rank connector is required");
  WC_ENFORCE(!runners_.empty(), "a receiver needs at least one runner");
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
    if (staging_) staging_->discard();
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
  const ReceiverPlace& p = opts_.place;
  if (spec.rank_offset < 1) {
    throw ReceiverError(400, "rank_offset: must be >= 1, group rank 0 is the source");
  }
  if (spec.rank_offset + p.rank_count > spec.world_size) {
    throw ReceiverError(400, "world_size: " + std::to_string(spec.world_size) +
                                 " leaves no room for " + std::to_string(p.rank_count) +
                                 " engine ranks at rank_offset " +
                                 std::to_string(spec.rank_offset));
  }
  std::shared_ptr<Group> old;
  {
    std::lock_guard lock(mu_);
    if (groups_.joining(spec.group_name)) {
      throw ReceiverError(409, "group '" + spec.group_name + "' is already being joined");
    }
    if (auto g = groups_.find(spec.group_name);
        g && (g->busy() || (session_.in_session() && g->used_in(session_.session_id())))) {
      throw ReceiverError(409, "group '" + spec.group_name + "' is in use by the open session");
    }
    old = groups_.begin_join(spec.group_name);
  }
  old.reset();
  ConnectOptions connect = opts_.connect;
  connect.rank_count = p.rank_count;
  connect.init_timeout = opts_.init_timeout;
  // join_rank() drives device base_gpu_id + engine rank.
  connect.base_gpu_id = p.cuda_device >= 0 ? p.cuda_device - p.engine_rank : 0;
  std::shared_ptr<Group> group;
  try {
    std::vector<std::unique_ptr<BucketChannel>> channels;
    channels.push_back(opts_.connector(spec, connect, p.engine_rank));
    GroupOptions gopts;
    gopts.comm_timeout = opts_.comm_timeout;
    gopts.max_ahead = opts_.max_buckets_ahead;
    gopts.pool = pool_;
    group = std::make_shared<Group>(spec, std::move(channels), gopts);
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    groups_.end_join(spec.group_name, nullptr);
    throw ReceiverError(join_status(e), "join group '" + spec.group_name + "' as engine rank " +
                                            std::to_string(p.engine_rank) + ": " + e.what());
  }
  std::lock_guard lock(mu_);
  groups_.end_join(spec.group_name, std::move(group));
}

void Receiver::leave(const std::string& group_name) {
  std::shared_ptr<Group> group;
  {
    std::lock_guard lock(mu_);
    group = groups_.find(group_name);
    if (!group) throw ReceiverError(409, "group_name: no group '" + group_name + "' is joined");
    if (session_.in_session() && (group->busy() || group->used_in(session_.session_id()))) {
      fail_session_locked(session_.session_id(), false, 409,
                          "group '" + group_name + "' left during the session");
    }
    groups_.remove(group_name);
  }
  group->abort(409, "group '" + group_name + "' left");
}

std::vector<std::string> Receiver::groups() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, group] : groups_.all()) out.push_back(name);
  return out;
}

ReceiverBegin Receiver::begin(Selector selector, std::optional<std::string> holder) {
  std::lock_guard lock(mu_);
  if (committing_) throw ReceiverError(409, "begin: the previous session is still committing");
  if (auto refusal = session_.begin(selector, std::move(holder))) refuse(*refusal);
  staging_ = std::make_shared<Staging>(1);
  session_names_.clear();
  return {session_.token(), version_, base_.held_digest(selector)};
}

void Receiver::fail_session_locked(std::uint64_t session_id, bool abort_busy_groups, int status,
                                   const std::string& reason) {
  if (!session_.in_session() || session_.session_id() != session_id) return;
  if (staging_) staging_->discard();
  staging_.reset();
  session_names_.clear();
  session_.close();
  // A group left half-way through a broadcast cannot be reused: its peers are out of step.
  for (auto& [name, group] : groups_.all()) {
    if (abort_busy_groups && group->busy()) group->abort(status, "session failed: " + reason);
  }
}

void Receiver::abort(const std::string& reason) {
  std::lock_guard lock(mu_);
  if (session_.in_session()) fail_session_locked(session_.session_id(), true, 409, reason);
}

std::shared_ptr<const DeltaSpec> Receiver::delta_spec_locked(const BucketDelta& delta) const {
  if (delta.base_version != version_ || !base_.has_base()) {
    throw ReceiverError(409, "delta.base_version: the delta is against weight_version '" +
                                 delta.base_version + "' but this receiver holds '" + version_ +
                                 (base_.has_base() ? "'" : "' with no delta base kept") +
                                 "; send the bucket in full");
  }
  if (delta.wire_bytes > opts_.max_bucket_bytes) {
    throw ReceiverError(
        400, "delta.wire_bytes: " + std::to_string(delta.wire_bytes) + " over the bucket limit");
  }
  std::vector<Digest> expected;
  try {
    for (const auto& d : delta.base_digests)
      expected.push_back(parse_digest(d, "delta.base_digests"));
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
  auto spec = std::make_shared<DeltaSpec>();
  spec->codec = delta.codec;
  spec->wire_bytes = delta.wire_bytes;
  spec->fill_base = [this, expected = std::move(expected)](
                        const BucketPlan& plan, const std::vector<std::vector<Runner>>& dest,
                        std::span<std::byte> bucket) {
    std::lock_guard lock(mu_);
    return base_.fill(plan, dest, expected, bucket);
  };
  return spec;
}

Receiver::Submitted Receiver::submit_locked(const UpdateWeightsFromDistributedRequest& request) {
  // A request without a selector (SGLang's body) takes the session's.
  const Selector selector = request.selector.value_or(session_.selector().value_or(Selector::kAll));
  if (auto refusal = session_.check_payload(selector)) refuse(*refusal);
  if (auto refusal = session_.check_owner(request.session_id, "update_weights_from_distributed")) {
    refuse(*refusal);
  }
  Submitted out{nullptr, groups_.find(request.group_name), session_.session_id()};
  if (!out.group) {
    throw ReceiverError(409, "group_name: no group '" + request.group_name + "' is joined");
  }
  std::vector<std::vector<Runner>> destinations;
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorMeta& meta = request.tensors[i];
    if (session_names_.count(meta.name)) {
      throw ReceiverError(400, "names[" + std::to_string(i) + "]: '" + meta.name +
                                   "' was already sent in this session");
    }
    std::vector<Runner> dest;
    for (const auto& r : runners_) {
      if (covers(selector, r.id) && r.filter.accepts(meta.name)) dest.push_back(r.id);
    }
    destinations.push_back(std::move(dest));
  }
  const std::uint64_t sequence =
      groups_.sequence(request.group_name, out.session_id, request.sequence);
  auto planned = plan_bucket(request, sequence, opts_.max_bucket_bytes);
  if (auto* refusal = std::get_if<Refusal>(&planned)) throw ReceiverError(400, refusal->message);
  BucketPlan plan = std::get<BucketPlan>(std::move(planned));
  std::shared_ptr<const DeltaSpec> delta;
  if (request.delta) delta = delta_spec_locked(*request.delta);
  out.job = std::make_shared<BucketJob>(out.session_id, std::move(plan), std::move(destinations),
                                        staging_, request.load_format == LoadFormat::kPerTensor,
                                        std::move(delta));
  if (auto refusal = out.group->submit(out.job)) refuse(*refusal);
  groups_.queued(request.group_name, sequence);
  for (const auto& meta : request.tensors) session_names_.insert(meta.name);
  if (request.weight_version) session_.set_version(*request.weight_version);
  return out;
}

std::size_t Receiver::receive(const UpdateWeightsFromDistributedRequest& request) {
  Submitted s;
  {
    std::lock_guard lock(mu_);
    s = submit_locked(request);
  }
  const auto budget = opts_.comm_timeout * static_cast<int>(opts_.max_buckets_ahead + 2);
  auto result = s.job->wait(comm::deadline_after(budget));
  if (!result) {
    result = JobResult{504, "bucket " + std::to_string(s.job->sequence()) +
                                " not received within " + std::to_string(budget.count()) + " ms"};
  }
  if (result->status == 200) return s.job->plan().total_bytes;
  // 409 without session_failed: the session was aborted meanwhile; the group is fine.
  const bool group_fine = result->session_failed || result->status == 409;
  if (!group_fine) s.group->abort(result->status, result->message);
  std::lock_guard lock(mu_);
  fail_session_locked(s.session_id, false, result->status, result->message);
  throw ReceiverError(result->status,
                      "receive: " + result->message + "; session aborted, previous weights kept");
}

void Receiver::set_version(const std::string& version,
                           const std::optional<std::string>& session_id) {
  std::lock_guard lock(mu_);
  if (auto refusal = session_.check_owner(session_id, "update_weight_version")) refuse(*refusal);
  if (session_.set_version(version)) version_ = version;
}

ReceiverCommit Receiver::commit(const std::optional<std::string>& version,
                                const std::optional<std::string>& session_id) {
  std::lock_guard commit_lock(commit_mu_);
  std::map<Runner, std::map<std::string, StagedTensor>> staged;
  Selector selector = Selector::kAll;
  std::optional<std::string> next_version;
  {
    std::lock_guard lock(mu_);
    if (auto refusal = session_.check_end()) refuse(*refusal);
    if (auto refusal = session_.check_owner(session_id, "end_weight_update")) refuse(*refusal);
    for (const auto& [name, group] : groups_.all()) {
      if (group->busy()) {
        throw ReceiverError(409, "commit: buckets of group '" + name + "' are still in flight");
      }
    }
    selector = *session_.selector();
    next_version = version ? version : session_.pending_version();
    for (const auto& r : runners_) {
      if (covers(selector, r.id)) staged[r.id] = staging_->take(r.id);
    }
    staging_.reset();
    session_names_.clear();
    session_.close();
    committing_ = true;
  }
  struct Done {
    Receiver* self;
    ~Done() {
      std::lock_guard lock(self->mu_);
      self->committing_ = false;
    }
  } done{this};
  // Every staged byte is checked before the first load: what reaches the engine is what the
  // unpack thread hashed while the bucket was hot.
  for (const auto& [id, tensors] : staged) {
    for (const auto& [name, t] : tensors) {
      if (t.rank_digests.empty() || !t.rank_digests[0] ||
          tensor_digest(t.bytes) != *t.rank_digests[0]) {
        throw ReceiverError(500, "commit: staged bytes of tensor '" + name + "' for runner '" +
                                     std::string(to_string(id)) +
                                     "' no longer match their digest at receive; nothing loaded, "
                                     "weight_version unchanged");
      }
    }
  }
  ReceiverCommit out;
  out.runners = load_staged(runners_, staged, base_);
  std::lock_guard lock(mu_);
  for (const auto& [id, tensors] : staged) {
    for (const auto& [name, t] : tensors) {
      base_.record(id, t.meta, t.bytes, *t.rank_digests[0]);
      out.bytes_loaded += t.bytes.size();
    }
  }
  if (next_version) version_ = *next_version;
  out.weight_version = version_;
  out.runner_digest = base_.held_digest(selector);
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
    if (session_.in_session()) throw ReceiverError(409, "install: a session is open");
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
  return session_.in_session();
}

std::optional<Selector> Receiver::session_selector() const {
  std::lock_guard lock(mu_);
  return session_.selector();
}

std::string Receiver::weight_version() const {
  std::lock_guard lock(mu_);
  return version_;
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

std::uint64_t Receiver::bytes_received() const {
  std::lock_guard lock(mu_);
  return groups_.bytes_received();
}

}  // namespace weightcast::sync::engine

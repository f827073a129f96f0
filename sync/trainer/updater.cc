#include "sync/trainer/updater.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <future>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "comm/host_identity.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/engine_checks.h"
#include "sync/trainer/http/engine_client.h"

namespace weightcast::sync::trainer {

namespace {

using comm::seconds_since;
using detail::numeric_version;

std::vector<std::unique_ptr<EngineApi>> make_clients(const std::vector<std::string>& urls,
                                                     const UpdaterOptions& options) {
  EngineClientOptions client;
  client.token = options.token;
  client.connect_timeout = options.connect_timeout;
  client.request_timeout = options.request_timeout;
  // A bucket answers once received; init once the group formed. Both wait on the data plane.
  client.data_timeout = std::max(options.buckets.timeout, options.group_timeout);
  client.flavor = options.engine_flavor;
  client.keep_alive = options.keep_alive;
  std::vector<std::unique_ptr<EngineApi>> out;
  for (const auto& url : urls) out.push_back(std::make_unique<EngineClient>(url, client));
  return out;
}

// Closes the engines' kept HTTP connections when an operation of the updater ends, however it
// ends: they serve the requests of one operation, and none holds an engine's handler thread (or
// a file descriptor) between updates.
struct CloseIdleConnections {
  const std::vector<EngineApi*>& engines;
  ~CloseIdleConnections() {
    for (EngineApi* engine : engines) engine->close_idle_connections();
  }
};

std::string default_holder(const std::string& prefix) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown-host");
  return std::string(host) + ":" + std::to_string(getpid()) + " " + prefix;
}

// The engines as plain pointers, in order; refuses none or a null one.
std::vector<EngineApi*> pointers(const std::vector<std::unique_ptr<EngineApi>>& engines) {
  if (engines.empty()) throw comm::ConfigError("DistributedUpdater: no engines given");
  std::vector<EngineApi*> out;
  for (const auto& e : engines) {
    WC_ENFORCE(e != nullptr, "null engine");
    out.push_back(e.get());
  }
  return out;
}

}  // namespace

DistributedUpdater::DistributedUpdater(std::vector<std::string> engine_urls, UpdaterOptions options)
    : DistributedUpdater(make_clients(engine_urls, options), options) {
  // Probes of dropped engines use clients of their own, bounded by the probe timeout.
  UpdaterOptions probe = options_;
  probe.connect_timeout = std::min(options_.connect_timeout, options_.probe_timeout);
  probe.request_timeout = options_.probe_timeout;
  elastic_.set_probes(make_clients(engine_urls, probe));
}

DistributedUpdater::DistributedUpdater(std::vector<std::unique_ptr<EngineApi>> engines,
                                       UpdaterOptions options)
    : options_(std::move(options)),
      selector_(options_.selector ? *options_.selector
                                  : weight_update_selector(options_.selector_config)),
      engines_(std::move(engines)),
      engine_ptrs_(pointers(engines_)),
      holder_(options_.holder.empty() ? default_holder(options_.group_prefix) : options_.holder),
      groups_(engine_ptrs_, options_.delta_codec, options_.delta),
      elastic_(engine_ptrs_, options_.on_engine_failure, options_.max_backoff_updates),
      sessions_(options_, selector_, holder_, engine_ptrs_, elastic_) {}

DistributedUpdater::~DistributedUpdater() {
  release_leases();
  groups_.destroy([this](std::size_t e) { return elastic_.is_member(e); });
}

const std::vector<ServerInfoResponse>& DistributedUpdater::connect() {
  if (!infos_.empty()) return infos_;
  std::vector<ServerInfoResponse> infos(engines_.size());
  throw_if_failed(
      "reading /server_info",
      on_all_engines(engine_ptrs_, "GET /server_info", [&infos](EngineApi& engine, std::size_t i) {
        infos[i] = engine.server_info();
      }));
  std::vector<int> counts;
  std::uint64_t version = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    check_engine_info(engines_[i]->url(), infos[i], selector_, options_.backend);
    shard_plans_.push_back(announced_shard_plans(engines_[i]->url(), infos[i]));
    counts.push_back(infos[i].rank_count);
    version = std::max(version, numeric_version(infos[i].weight_version));
  }
  group_ranks(counts);  // validates
  choose_colocated(infos);
  common_ = std::any_of(engines_.begin(), engines_.end(),
                        [](const auto& e) { return e->flavor() == EngineFlavor::kSglang; });
  if (common_) check_common_format(engine_ptrs_, options_.common_load_format);
  elastic_.set_rank_counts(std::move(counts));
  sessions_.set_engines(common_, version);
  infos_ = std::move(infos);
  return infos_;
}

void DistributedUpdater::choose_colocated(const std::vector<ServerInfoResponse>& infos) {
  colocated_.assign(engines_.size(), false);
  if (options_.colocate == ColocateMode::kOff) return;
  // auto stays on the chain with NCCL: device buffers travel fastest there, and the colocated
  // path stages through host memory.
  if (options_.colocate == ColocateMode::kAuto && options_.backend != Backend::kGloo) return;
  const std::string here = comm::host_identity();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    colocated_[i] = !here.empty() && engines_[i]->flavor() == EngineFlavor::kWeightcast &&
                    infos[i].colocate_host == here;
  }
  if (options_.colocate == ColocateMode::kOn &&
      std::none_of(colocated_.begin(), colocated_.end(), [](bool c) { return c; })) {
    throw comm::ConfigError(
        "colocate on: no engine takes colocated buckets from this process (none is a "
        "weightcast-engine on this host, in this network namespace, of this user); use "
        "colocate auto to fall back to the chain");
  }
  if (options_.colocate_memory == ColocateMemory::kCuda &&
      std::any_of(colocated_.begin(), colocated_.end(), [](bool c) { return c; })) {
    try {
      colocate_device_ = comm::cuda_resolve_device(options_.cuda_device);  // on the caller's thread
    } catch (const comm::ConfigError& e) {
      throw comm::ConfigError(std::string("colocate memory cuda: ") + e.what() +
                              "; use colocate memory host");
    }
  }
}

bool DistributedUpdater::colocated(std::size_t engine) const {
  return engine < colocated_.size() && colocated_[engine];
}

std::vector<std::size_t> DistributedUpdater::chain_members() const {
  std::vector<std::size_t> out;
  for (std::size_t e : elastic_.members()) {
    if (!colocated(e)) out.push_back(e);
  }
  return out;
}

LoadFormat DistributedUpdater::load_format() const {
  return common_ ? options_.common_load_format : LoadFormat::kWeightcastBucket;
}

void DistributedUpdater::ensure_group(int stage) {
  const CloseIdleConnections close_idle{engine_ptrs_};
  connect();
  const std::uint64_t epoch = elastic_.epoch();
  const std::vector<std::size_t> chain = chain_members();
  const bool sharded = sharding(chain);
  // The classes change only with the members (each change is a new epoch): computed once per
  // epoch, not per update (every plan's class key hashes all of its entries).
  if (sharded && classes_epoch_ != epoch) {
    classes_ = shard_classes(chain, shard_plans_, elastic_.rank_counts());
    classes_epoch_ = epoch;
  }
  groups_.ensure(stage, chain, elastic_.rank_counts(),
                 sharded ? std::optional(classes_) : std::nullopt,
                 group_options(stage, epoch, chain), epoch,
                 [this](std::size_t e) { return elastic_.is_member(e); });
}

bool DistributedUpdater::sharding(const std::vector<std::size_t>& chain) const {
  if (options_.shard == ShardMode::kOff || common_) return false;
  return std::any_of(chain.begin(), chain.end(), [&](std::size_t e) {
    return e < shard_plans_.size() && !shard_plans_[e].empty();
  });
}

GroupOptions DistributedUpdater::group_options(int stage, std::uint64_t epoch,
                                               const std::vector<std::size_t>& chain) const {
  GroupOptions opts;
  // A new epoch, a new name: an engine still holding a group of an older set cannot join.
  opts.name = group_name(options_.group_prefix, stage);
  if (epoch > 0) opts.name += "-e" + std::to_string(epoch);
  opts.backend = options_.backend;
  opts.bind_address = options_.bind_address;
  opts.token = options_.store_token;
  opts.timeout = options_.group_timeout;
  opts.factory = options_.communicator_factory;
  opts.cuda_device = options_.cuda_device;
  opts.allow_same_user_reads = options_.allow_same_user_reads;
  opts.torch = common_;
  opts.torch_protocol = options_.torch_protocol;
  for (std::size_t e : chain) {
    opts.name_rendezvous.push_back(engines_[e]->flavor() != EngineFlavor::kSglang);
  }
  return opts;
}

BucketSendResult DistributedUpdater::send_stage(
    const UpdateSession& session, int stage, std::span<const NamedTensor> tensors,
    std::function<void(const std::string&, comm::Deadline)> await_tensor) {
  WC_ENFORCE(session.adapter() || session.selector() == selector_, "a session with selector ",
             to_string(session.selector()), " on an updater with selector ", to_string(selector_));
  const auto index = static_cast<std::size_t>(stage);
  WC_ENFORCE(groups_.ensured(stage), "ensure_group(", stage, ") first");
  // Member i of the session goes on the chain or takes the colocated path.
  std::vector<EngineApi*> chain;
  std::vector<std::size_t> chain_slots;
  std::vector<ColocatedEngine> same_host;
  const auto& members = elastic_.members();
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (colocated(members[i])) {
      same_host.push_back({engine_ptrs_[members[i]], i});
    } else {
      chain.push_back(engine_ptrs_[members[i]]);
      chain_slots.push_back(i);
    }
  }
  ShardedStage* const sharded = groups_.sharded(stage);
  WC_ENFORCE(chain.empty() || groups_.group(stage) || sharded, "ensure_group(", stage, ") first");
  // Plans describe how the target's loader narrows the base weights: an adapter session, or
  // one that updates the draft alone, sends its tensors whole (a draft may keep a target tensor,
  // lm_head, whole while the target slices it), so its tensors are not checked against them.
  const bool whole = session.adapter() || session.selector() == Selector::kDraft;
  if (sharded && !whole) {
    if (BucketSendResult refused = check_plans(tensors); !refused.ok) return refused;
  }
  BucketSendOptions opts = options_.buckets;
  opts.memory =
      options_.backend == Backend::kNccl ? comm::MemoryKind::kCuda : comm::MemoryKind::kHost;
  // The staging buffer is allocated on the calling thread's current device: make it the group's.
  if (opts.memory == comm::MemoryKind::kCuda && options_.cuda_device >= 0) {
    comm::cuda_set_device(options_.cuda_device);
  }
  opts.load_format = load_format();
  if (await_tensor) opts.await_tensor = std::move(await_tensor);
  // SGLang serializes bucket requests (Miles holds a lock around each).
  if (common_) opts.max_in_flight = 1;
  // An adapter's deltas are against the adapter of that name: a base per adapter and stage.
  if (options_.delta != DeltaMode::kOff && !common_ && !chain.empty() && !sharded) {
    auto& sources = session.adapter() ? adapter_delta_sources_[*session.adapter()] : delta_sources_;
    if (sources.size() <= index) sources.resize(index + 1);
    if (!sources[index]) {
      sources[index] = std::make_unique<DeltaSource>(options_.delta_codec, options_.delta);
    }
    opts.delta = sources[index].get();
  }
  // The same-host engines copy out of shared segments while the chain broadcasts.
  std::future<BucketSendResult> beside;
  if (!same_host.empty()) {
    if (colocated_senders_.size() <= index) colocated_senders_.resize(index + 1);
    if (!colocated_senders_[index]) {
      colocated_senders_[index] =
          std::make_unique<ColocatedSender>(options_.colocate_memory, colocate_device_);
    }
    beside = std::async(std::launch::async, [&] {
      return colocated_senders_[index]->send(session, same_host, tensors, opts);
    });
  }
  if (chain.empty()) return beside.get();
  BucketSendResult result;
  if (sharded) {
    const auto slot = [&members](std::size_t e) {
      return static_cast<std::size_t>(std::find(members.begin(), members.end(), e) -
                                      members.begin());
    };
    result = sharded->send(session, engine_ptrs_, tensors, std::move(opts), slot,
                           session.adapter().value_or(""), whole);
  } else {
    WeightGroup& group = *groups_.group(stage);
    result = send_buckets(session, group.name(), group.comm(), chain, tensors, opts, chain_slots);
    result.data_path = std::string(group.comm().data_path());
  }
  if (beside.valid()) merge_beside(result, beside.get());
  return result;
}

BucketSendResult DistributedUpdater::check_plans(std::span<const NamedTensor> tensors) const {
  BucketSendResult result;
  std::vector<TensorMeta> metas;
  for (const NamedTensor& t : tensors) metas.push_back(t.meta);
  for (std::size_t e : chain_members()) {
    try {
      check_shard_plans(engines_[e]->url(), shard_plans_[e], metas);
    } catch (const comm::BadRequestError& error) {
      result.ok = false;
      result.failures.push_back({engines_[e]->url(), "GET /server_info", error.what()});
    }
  }
  if (!result.ok) result.error = "a shard plan does not describe the tensors sent";
  return result;
}

void DistributedUpdater::reserve_buffers(std::span<const TensorMeta> tensors) {
  connect();  // the load format depends on the engines
  // Pack buffers and the delta calibration serve the chain only: colocated engines read the
  // tensors in place or from the colocated sender's own segments.
  if (chain_members().empty()) return;
  BucketSendOptions opts = options_.buckets;
  opts.memory =
      options_.backend == Backend::kNccl ? comm::MemoryKind::kCuda : comm::MemoryKind::kHost;
  opts.load_format = load_format();
  reserve_send_buffers(tensors, opts);
  if (options_.delta == DeltaMode::kAuto && !common_)
    prepare_delta_calibration(options_.delta_codec);
}

void DistributedUpdater::record(const BucketSendResult& result, UpdateReport& report) {
  report.tensors += result.tensors;
  report.bytes += result.bytes;
  report.buckets += result.buckets;
  report.wire_bytes += result.wire_bytes;
  report.delta_buckets += result.delta_buckets;
  report.phases.data += result.seconds;
  report.http_wait_seconds += result.http_wait_seconds;
  report.pack_wait_seconds += result.pack_wait_seconds;
  report.wire_seconds += result.broadcast_seconds;
  report.hash_wait_seconds += result.hash_wait_seconds;
  if (report.data_path.empty()) report.data_path = result.data_path;
  if (!result.delta_change.empty()) report.delta_change = result.delta_change;
  report.failures.insert(report.failures.end(), result.failures.begin(), result.failures.end());
  if (!result.ok) {
    report.trainer_fault = result.source_fault;
    abort(report, result.error.empty() ? "sending buckets failed"
                                       : "sending buckets failed (" + result.error + ")");
  }
}

UpdateReport DistributedUpdater::update(std::span<const NamedTensor> tensors,
                                        std::optional<std::string> version) {
  return update_attempts(tensors, version, std::nullopt);
}

UpdateReport DistributedUpdater::update_lora(const std::string& name,
                                             std::span<const NamedTensor> tensors,
                                             const LoraConfig& config, bool upsert,
                                             std::optional<std::string> version) {
  validate_adapter_name(name);
  // Misuse is refused before any engine is asked: every tensor an A or B of a targeted module.
  for (const auto& t : tensors) adapted_module(config, t.meta.name);
  // Every attempt commits the same version, chosen once.
  if (!version) version = sessions_.next_adapter_version(name);
  return update_attempts(tensors, version, LoraBegin{name, to_json_string(config), upsert});
}

UpdateReport DistributedUpdater::update_attempts(std::span<const NamedTensor> tensors,
                                                 const std::optional<std::string>& version,
                                                 const std::optional<LoraBegin>& adapter) {
  const CloseIdleConnections close_idle{engine_ptrs_};
  prepare_update();
  std::vector<UpdateReport::Dropped> dropped;
  // Each attempt that fails drops at least one engine, so there are at most as many as engines.
  for (std::size_t attempt = 0;; ++attempt) {
    UpdateReport report = update_once(tensors, version, adapter);
    report.dropped.insert(report.dropped.begin(), dropped.begin(), dropped.end());
    if (report.ok || attempt + 1 >= engines_.size() || !drop_failed(report)) {
      note_membership(report);
      return report;
    }
    dropped = std::move(report.dropped);
  }
}

std::vector<std::string> DistributedUpdater::prepare_update() {
  return elastic_.prepare_update([this] { connect(); });
}

bool DistributedUpdater::drop_failed(UpdateReport& report) {
  return elastic_.drop_failed(report);
}

void DistributedUpdater::adopt(const UpdateSession& session) {
  elastic_.adopt(session);
}

void DistributedUpdater::note_membership(UpdateReport& report) const {
  elastic_.note_membership(report);
}

std::optional<UpdateSession> DistributedUpdater::open_session(UpdateReport& report,
                                                              std::optional<std::string> version,
                                                              std::optional<LoraBegin> adapter) {
  connect();
  if (adapter) {
    for (std::size_t e : elastic_.members()) {
      check_takes_adapters(engines_[e]->url(), infos_[e], adapter->name);
    }
    report.adapter = adapter->name;
    if (!version) version = sessions_.next_adapter_version(adapter->name);
  }
  return sessions_.open(report, std::move(version), std::move(adapter));
}

void DistributedUpdater::finish(const UpdateSession& session, UpdateReport& report) {
  const CloseIdleConnections close_idle{engine_ptrs_};
  sessions_.finish(session, report);
}

void DistributedUpdater::abort(UpdateReport& report, const std::string& why) {
  const CloseIdleConnections close_idle{engine_ptrs_};
  sessions_.abort(report, why);
}

void DistributedUpdater::release_leases() {
  const CloseIdleConnections close_idle{engine_ptrs_};
  sessions_.release_leases();
}

UpdateReport DistributedUpdater::update_once(std::span<const NamedTensor> tensors,
                                             const std::optional<std::string>& version,
                                             const std::optional<LoraBegin>& adapter) {
  UpdateReport report;
  const auto start = comm::Clock::now();
  try {
    ensure_group(0);
  } catch (const EngineCallError& e) {
    sessions_.start_report(report, version);
    report.failures = e.failures();
    report.fail("preparing the update failed");
    return report;
  } catch (const comm::ConfigError&) {
    throw;
  } catch (const comm::EnforceError&) {
    throw;
  } catch (const comm::Error& e) {
    sessions_.start_report(report, version);
    report.fail(std::string("preparing the update failed: ") + e.what());
    return report;
  }
  const double prepare = seconds_since(start);
  const auto session = open_session(report, version, adapter);
  report.phases.prepare = prepare;
  if (!session) return report;
  record(send_stage(*session, 0, tensors), report);
  if (!report.error.empty()) return report;
  finish(*session, report);
  return report;
}

}  // namespace weightcast::sync::trainer

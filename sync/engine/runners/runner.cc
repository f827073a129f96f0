#include "sync/engine/runners/runner.h"

#include <malloc.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "sync/engine/stage/ordered_insert.h"
#include "sync/model/bucket.h"

namespace weightcast::sync::engine {

namespace {

using comm::seconds_since;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// The raw staged tensors as fresh resident tensors (every rank's copy was checked against the
// first's before: find_rank_disagreement()). Fills `rank_staged` with each rank's combined digest
// over them.
std::map<std::string, ResidentTensor> fresh_tensors(std::map<std::string, StagedTensor> staged,
                                                    int rank_count,
                                                    std::vector<Digest>& rank_staged) {
  // The staged map is in name order, so each rank's combined digest is built as it goes.
  std::vector<CombinedHasher> per_rank(static_cast<std::size_t>(rank_count));
  std::map<std::string, ResidentTensor> fresh;
  for (auto& [name, tensor] : staged) {
    for (std::size_t r = 0; r < per_rank.size() && r < tensor.rank_digests.size(); ++r) {
      per_rank[r].add(name, tensor.rank_digests[r].value_or(Digest{}));
    }
    ResidentTensor t;
    t.meta = std::move(tensor.meta);
    t.bytes = std::move(tensor.bytes);
    t.digest = tensor.rank_digests.empty() ? Digest{} : tensor.rank_digests[0].value_or(Digest{});
    t.laid_out = false;
    fresh.emplace_hint(fresh.end(), name, std::move(t));
  }
  rank_staged.clear();
  if (!fresh.empty()) {
    for (const auto& hasher : per_rank) rank_staged.push_back(hasher.digest());
  }
  return fresh;
}

void apply_and_rehash(Layout layout, ResidentTensor& tensor) {
  apply_layout(layout, tensor.meta, tensor.bytes.span());
  tensor.digest = tensor_digest(tensor.bytes);
  tensor.laid_out = true;
}

}  // namespace

void finalize_tensor(Layout layout, ResidentTensor& tensor) {
  if (tensor.laid_out) return;
  if (layout == Layout::kNone) {
    tensor.laid_out = true;
    return;
  }
  apply_and_rehash(layout, tensor);
}

RunnerSet::RunnerSet(std::vector<RunnerConfig> configs, std::string initial_version, int rank_count)
    : rank_count_(rank_count),
      version_(std::make_shared<WeightVersion>(std::move(initial_version))) {
  WC_ENFORCE_GT(rank_count, 0, "engine rank count");
  WC_ENFORCE(!configs.empty(), "an engine holds at least one runner");
  for (auto& config : configs) {
    WC_ENFORCE(find(config.id) == nullptr, "runner '", to_string(config.id), "' given twice");
    Slot slot;
    slot.config = std::move(config);
    slot.digest_time = std::chrono::steady_clock::now();
    slots_.push_back(std::move(slot));
  }
  WC_ENFORCE(find(Runner::kTarget) != nullptr, "an engine always holds the target runner");
}

RunnerSet::Slot* RunnerSet::find(Runner id) {
  for (auto& slot : slots_) {
    if (slot.config.id == id) return &slot;
  }
  return nullptr;
}

const RunnerSet::Slot* RunnerSet::find(Runner id) const {
  for (const auto& slot : slots_) {
    if (slot.config.id == id) return &slot;
  }
  return nullptr;
}

const RunnerSet::Slot& RunnerSet::get(Runner id) const {
  const Slot* slot = find(id);
  WC_ENFORCE(slot != nullptr, "runner '", to_string(id), "' is not held by this engine");
  return *slot;
}

void RunnerSet::load_initial(Runner id, std::vector<RawTensor> tensors) {
  // The initial weights go into one pool block (a copy, at start-up), so that once an update
  // has replaced them their memory serves the next update's buckets instead of being unmapped
  // while fresh pages are faulted in.
  std::size_t total = 0;
  for (const auto& raw : tensors) total += round_up(raw.bytes.size(), kDefaultBucketAlignment);
  // Bucket padding and per-block page rounding: an update needs a little more than the weights.
  const std::size_t room = total + total / 64 + (std::size_t{4} << 20);
  pool_->reserve(room);  // huge pages, like every later update's blocks
  auto block = pool_->acquire(room);
  std::map<std::string, ResidentTensor> loaded;
  const Layout layout = get(id).config.layout;
  std::size_t offset = 0;
  for (auto& raw : tensors) {
    WC_ENFORCE_EQ(raw.bytes.size(), raw.meta.byte_count(), "initial tensor '", raw.meta.name, "'");
    ResidentTensor t;
    const std::span<std::byte> place(block->data() + offset, raw.bytes.size());
    std::copy(raw.bytes.begin(), raw.bytes.end(), place.begin());
    offset += round_up(raw.bytes.size(), kDefaultBucketAlignment);
    std::vector<std::byte>().swap(raw.bytes);  // keeps start-up at 2 x weights, not 3
    t.bytes = SharedBytes(block, place);
    t.digest = tensor_digest(t.bytes);
    t.meta = std::move(raw.meta);
    finalize_tensor(layout, t);
    const std::string name = t.meta.name;
    WC_ENFORCE(loaded.emplace(name, std::move(t)).second, "initial tensor '", name, "' twice");
  }
  // Freed heap memory goes back to the system before the reserve below, or start-up would hold
  // the generated copies, the block and the reserve at once.
  malloc_trim(0);
  // As much again, pre-faulted, for the first update's buckets: 2 x weights is the engine's
  // budget during an update anyway, and the first update then pays no page faults.
  pool_->reserve(room);
  std::unique_lock lock(mu_);
  Slot* slot = find(id);
  slot->tensors = std::move(loaded);
  slot->rank_staged.clear();
  slot->digest_time = std::chrono::steady_clock::now();
}

bool RunnerSet::has(Runner id) const {
  return find(id) != nullptr;
}

std::vector<Runner> RunnerSet::runners() const {
  std::vector<Runner> out;
  for (Runner id : kAllRunners) {
    if (has(id)) out.push_back(id);
  }
  return out;
}

const RunnerConfig& RunnerSet::config(Runner id) const {
  return get(id).config;
}

std::vector<Runner> RunnerSet::destinations(Selector selector, std::string_view name) const {
  std::vector<Runner> out;
  for (Runner id : covered_runners(selector)) {
    const Slot* slot = find(id);
    if (slot != nullptr && slot->config.filter.accepts(name)) out.push_back(id);
  }
  return out;
}

struct RunnerSet::Prepared {
  Runner id;
  std::map<std::string, ResidentTensor> fresh;
  std::vector<Digest> rank_staged;
};

std::vector<RunnerSet::Prepared> RunnerSet::prepare(StagedByRunner staged,
                                                    Selector selector) const {
  // Every runner is verified before any is transformed, since a view staged for two runners must
  // be copied for the second before the first one's layout rewrites it in place.
  std::vector<Prepared> prepared;
  for (Runner id : covered_runners(selector)) {
    if (find(id) == nullptr) continue;
    Prepared p{id, {}, {}};
    p.fresh = fresh_tensors(std::move(staged[id]), rank_count_, p.rank_staged);
    prepared.push_back(std::move(p));
  }
  // Only a second runner can stage a view the first one holds too (a tensor loaded by both).
  if (prepared.size() > 1) {
    std::set<const std::byte*> claimed;
    for (auto& p : prepared) {
      for (auto& [name, tensor] : p.fresh) {
        if (!tensor.bytes.empty() && !claimed.insert(tensor.bytes.data()).second) {
          tensor.bytes = SharedBytes::copy_of(tensor.bytes);
        }
      }
    }
  }
  return prepared;
}

std::vector<RunnerCommit> RunnerSet::lay_out(std::vector<Prepared>& prepared,
                                             bool legacy_finalize) const {
  std::vector<RunnerCommit> report;
  for (auto& p : prepared) {
    const Layout layout = find(p.id)->config.layout;
    RunnerCommit stats;
    stats.runner = p.id;
    for (auto& [name, tensor] : p.fresh) {
      stats.tensors_loaded += 1;
      stats.bytes_loaded += tensor.bytes.size();
      if (!legacy_finalize) {
        if (layout != Layout::kNone) stats.tensors_transformed += 1;
        finalize_tensor(layout, tensor);
      }
    }
    report.push_back(stats);
  }
  return report;
}

void RunnerSet::install_locked(std::vector<Prepared>& prepared, std::vector<RunnerCommit>& report,
                               bool legacy_finalize) {
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < prepared.size(); ++i) {
    auto& p = prepared[i];
    Slot& slot = *find(p.id);
    const bool changed = !p.fresh.empty();
    // A swap: the replaced tensors land in p.fresh and are released after the lock, returning
    // their blocks to the pool once no tensor views them.
    // Both maps are in name order: each lookup starts right after the previous one.
    auto hint = slot.tensors.begin();
    for (auto& [name, tensor] : p.fresh) {
      const auto it = place_in_order(slot.tensors, hint, name);
      std::swap(it->second, tensor);
      hint = std::next(it);
    }
    if (changed) slot.rank_staged = std::move(p.rank_staged);
    if (legacy_finalize) {
      // The old post-load processing: every resident tensor of a covered runner is processed
      // again, whether it was loaded in this session or not.
      if (slot.config.layout != Layout::kNone) {
        for (auto& [name, tensor] : slot.tensors) {
          apply_and_rehash(slot.config.layout, tensor);
          report[i].tensors_transformed += 1;
        }
      }
      slot.digest_time = now;
    } else if (changed) {
      slot.digest_time = now;
    }
  }
}

std::vector<RunnerCommit> RunnerSet::commit(Staging& staging, Selector selector,
                                            const std::optional<std::string>& version,
                                            bool legacy_finalize) {
  StagedByRunner staged;
  for (Runner id : runners()) {
    if (covers(selector, id)) staged[id] = staging.take(id);
  }
  // A Receiver checks its ranks' copies before it loads (sync/engine/commit/local_ranks.h); a
  // caller without one gets the same rule here, before anything is pending.
  if (auto d = find_rank_disagreement(staged, static_cast<std::size_t>(rank_count_))) {
    throw comm::PeerError("engine rank " + std::to_string(d->rank),
                          "runner '" + std::string(to_string(d->runner)) + "': tensor '" +
                              d->tensor +
                              (d->missing ? "' was not received by this rank"
                                          : "' differs from engine rank 0's copy"));
  }
  {
    std::lock_guard lock(pending_mu_);
    for (auto& [id, tensors] : staged) {
      for (auto& [name, t] : tensors) pending_of(id)[name] = std::move(t);
    }
  }
  return publish(selector, version, legacy_finalize);
}

ReceiverRunner RunnerSet::receiver_runner(Runner id) {
  const Slot& slot = get(id);
  ReceiverRunner r;
  r.id = id;
  r.filter = slot.config.filter;
  r.load = [this, id](std::span<const TensorView> views) {
    std::lock_guard lock(pending_mu_);
    auto& pending = pending_of(id);
    // A layer's tensors come in name order: each goes in right after the previous one.
    auto hint = pending.end();
    for (const TensorView& v : views) {
      // Built first, so that a throw leaves the pending entry as it was. Only views that are not
      // staged come here (initial weights): a commit's staged tensors are adopted whole.
      StagedTensor t;
      t.meta = *v.meta;
      t.bytes = SharedBytes::copy_of(v.bytes);
      t.rank_digests.assign(static_cast<std::size_t>(rank_count_), tensor_digest(v.bytes));
      hint = std::next(pending.insert_or_assign(hint, v.meta->name, std::move(t)));
    }
  };
  // A commit's staged tensors taken whole: they are what load() would copy, one by one.
  r.adopt = [this, id](std::map<std::string, StagedTensor>&& tensors) {
    std::lock_guard lock(pending_mu_);
    auto& pending = pending_of(id);
    // An adopted tensor replaces a pending one of the same name; merge() moves the other pending
    // nodes over, allocating nothing.
    tensors.merge(pending);
    pending = std::move(tensors);
  };
  r.check = [this, id](const TensorMeta& meta) -> std::optional<std::string> {
    // Compared in place, under the lock: copying each resident meta out cost more than the rest
    // of the check, and this runs for every tensor of every bucket.
    std::shared_lock lock(mu_);
    const Slot& held = get(id);
    const auto it = held.tensors.find(meta.name);
    if (it == held.tensors.end()) return std::nullopt;
    const TensorMeta* resident = &it->second.meta;
    if (resident->dtype == meta.dtype && resident->shape == meta.shape) return std::nullopt;
    return "'" + meta.name + "' is " + std::string(to_string(meta.dtype)) + shape_text(meta.shape) +
           " but runner '" + std::string(to_string(id)) + "' holds " +
           std::string(to_string(resident->dtype)) + shape_text(resident->shape);
  };
  r.shape_of = [this, id](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
    std::shared_lock lock(mu_);
    const Slot& held = get(id);
    const auto it = held.tensors.find(name);
    if (it == held.tensors.end()) return std::nullopt;
    return it->second.meta.shape;
  };
  return r;
}

void RunnerSet::discard_pending() {
  std::lock_guard lock(pending_mu_);
  for (auto& pending : pending_) pending.clear();
}

std::vector<RunnerCommit> RunnerSet::publish(Selector selector,
                                             const std::optional<std::string>& version,
                                             bool legacy_finalize) {
  StagedByRunner staged;
  {
    std::lock_guard lock(pending_mu_);
    for (Runner id : kAllRunners) {
      auto& pending = pending_of(id);
      if (pending.empty()) continue;
      staged[id] = std::move(pending);
      pending.clear();  // a moved-from map is valid but unspecified
    }
  }
  // Verify and transform outside the lock: nothing here is visible to readers yet.
  std::vector<Prepared> prepared = prepare(std::move(staged), selector);
  std::vector<RunnerCommit> report = lay_out(prepared, legacy_finalize);
  std::unique_lock lock(mu_);
  install_locked(prepared, report, legacy_finalize);
  if (version) version_->set(*version);
  return report;
}

std::string RunnerSet::weight_version() const {
  std::shared_lock lock(mu_);
  return version_->get();
}

void RunnerSet::set_weight_version(std::string version) {
  std::unique_lock lock(mu_);
  version_->set(std::move(version));
}

Digest RunnerSet::covered_digest(Selector selector) const {
  std::vector<NamedDigest> covered;
  for (Runner id : runners()) {
    if (covers(selector, id)) covered.push_back({std::string(to_string(id)), combined_of(id)});
  }
  return combined_digest(std::move(covered));
}

RunnerChecksum RunnerSet::checksum(Runner id, bool recompute) const {
  std::shared_lock lock(mu_);
  const Slot& slot = get(id);
  RunnerChecksum out;
  out.runner = id;
  out.layout = slot.config.layout;
  out.tensors.reserve(slot.tensors.size());
  out.metas.reserve(slot.tensors.size());
  CombinedHasher combined;
  for (const auto& [name, tensor] : slot.tensors) {
    out.tensors.push_back({name, recompute ? tensor_digest(tensor.bytes) : tensor.digest});
    out.metas.push_back(tensor.meta);
    combined.add(name, out.tensors.back().digest);
  }
  out.combined = combined.digest();
  out.weight_version = version_->get();
  out.rank_staged = slot.rank_staged;
  for (const auto& d : slot.rank_staged)
    out.ranks_agree = out.ranks_agree && d == slot.rank_staged[0];
  out.digest_age_s = seconds_since(slot.digest_time);
  return out;
}

Digest RunnerSet::combined_of(Runner id) const {
  std::shared_lock lock(mu_);
  CombinedHasher combined;
  for (const auto& [name, tensor] : get(id).tensors) combined.add(name, tensor.digest);
  return combined.digest();
}

double RunnerSet::digest_age_seconds(Runner id) const {
  std::shared_lock lock(mu_);
  return seconds_since(get(id).digest_time);
}

std::size_t RunnerSet::tensor_count(Runner id) const {
  std::shared_lock lock(mu_);
  return get(id).tensors.size();
}

bool RunnerSet::with_tensor(Runner id, const std::string& name,
                            const std::function<void(const ResidentTensor&)>& fn) const {
  std::shared_lock lock(mu_);
  const Slot& slot = get(id);
  auto it = slot.tensors.find(name);
  if (it == slot.tensors.end()) return false;
  fn(it->second);
  return true;
}

}  // namespace weightcast::sync::engine

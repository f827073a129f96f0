// RunnerSet: the engine's runners (target, optionally draft) and the weight_version, the state a
// weight update commits into.
//
// Each runner holds named tensors with a per-tensor layout state: a tensor is resident either raw
// or laid out by the runner's post-load transform (sync/model/layout.h). commit() moves a session's
// staged tensors into every covered runner and transforms only the tensors that are not laid out
// yet, i.e. those loaded in this session; so a runner that loaded nothing is left bit-identical,
// whatever the selector. legacy_finalize reproduces the old behaviour on purpose: it re-applies
// the transform to every resident tensor of every covered runner (the double-shuffle bug).
// Committed tensors are the staged views themselves (a swap, no copy); the layout transform runs
// in place on the runner's own view. A tensor staged for two runners gets a private copy for the
// second, so one runner's transform never shows through the other.
// Digests are kept per tensor and recomputed when a tensor changes; digests and weight_version are
// read under one lock, so a reader never sees one without the other. checksum(id, recompute)
// hashes the resident bytes again instead, so a change that bypassed the stored digest (memory
// corruption, a transform applied behind the runner's back) shows.
// Lifetime: owned by the Engine for the process lifetime. Threading: readers (checksums, the
// tensor accessor for later probes) take a shared lock, commit takes it exclusively; every
// method is thread-safe.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/commit/weight_version.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/name_filter.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::engine {

struct RunnerConfig {
  Runner id = Runner::kTarget;
  NameFilter filter;
  Layout layout = Layout::kNone;
  // Where the initial weights came from, for /server_info: the model spec (JSON) and seed of the
  // deterministic generator, or null/nullopt for a safetensors file named in `source`.
  nlohmann::json model;
  std::optional<std::uint64_t> seed;
  std::string source = "generated";
};

struct ResidentTensor {
  TensorMeta meta;
  SharedBytes bytes;      // usually a view of the pool block its bucket was received into
  Digest digest;          // of `bytes`, as resident
  bool laid_out = false;  // the runner's layout has been applied to `bytes`
};

struct RawTensor {
  TensorMeta meta;
  std::vector<std::byte> bytes;  // numel * element size, before any layout
};

struct RunnerChecksum {
  Runner runner = Runner::kTarget;
  Layout layout = Layout::kNone;
  std::vector<NamedDigest> tensors;  // name order
  std::vector<TensorMeta> metas;     // parallel to `tensors`
  Digest combined;
  std::string weight_version;
  // Per engine rank, the combined digest of the raw tensors that rank staged in the last commit
  // that loaded this runner (empty before any). Equal entries: every rank received the same.
  std::vector<Digest> rank_staged;
  bool ranks_agree = true;
  double digest_age_s = 0;  // since the digests last changed (start or a commit)
};

// What commit() did to one covered runner.
struct RunnerCommit {
  Runner runner = Runner::kTarget;
  std::size_t tensors_loaded = 0;       // staged tensors moved into the runner
  std::size_t tensors_transformed = 0;  // layout applications (legacy: every resident tensor)
  std::size_t bytes_loaded = 0;
};

class RunnerSet {
 public:
  RunnerSet(std::vector<RunnerConfig> configs, std::string initial_version, int rank_count);

  // Installs a runner's initial weights and lays them out with its layout, as an inference
  // engine's post-load processing would. Call before serving.
  void load_initial(Runner id, std::vector<RawTensor> tensors);

  bool has(Runner id) const;
  std::vector<Runner> runners() const;  // held runners, kAllRunners order
  const RunnerConfig& config(Runner id) const;
  int rank_count() const { return rank_count_; }
  // The pool that received buckets live in: committed tensors keep its blocks, and blocks the
  // runners no longer view return to it for the next update.
  const std::shared_ptr<BlockPool>& block_pool() const { return pool_; }

  // Held runners that `selector` covers and whose filter accepts `name`.
  std::vector<Runner> destinations(Selector selector, std::string_view name) const;

  // The runner as a Receiver sees it (sync/engine/commit/receiver_loader.h): `load` keeps each
  // staged tensor's pool block itself (no copy) as pending, `check` refuses a tensor whose dtype or
  // shape differs from the resident one. Nothing is visible until publish().
  ReceiverRunner receiver_runner(Runner id);
  // Makes what the receiver loaded since the last publish() the runners' tensors, as one
  // transaction for readers: lays out the fresh tensors of the runners `selector` covers (legacy:
  // every resident tensor again) and sets `version` when given. The receiver checked its ranks'
  // copies before it loaded (sync/engine/commit/local_ranks.h); nothing checks them again here.
  std::vector<RunnerCommit> publish(Selector selector, const std::optional<std::string>& version,
                                    bool legacy_finalize);
  // Drops what was loaded since the last publish() (a failed commit).
  void discard_pending();
  // Loads `staging` and publishes it (tests and callers without a Receiver), after the same check
  // of the ranks' copies a Receiver makes (find_rank_disagreement()): comm::PeerError naming the
  // engine rank when ranks staged different bytes; nothing changes then.
  std::vector<RunnerCommit> commit(Staging& staging, Selector selector,
                                   const std::optional<std::string>& version, bool legacy_finalize);

  std::string weight_version() const;
  void set_weight_version(std::string version);
  // Where the weight_version lives: shared with the engine's Receiver, which reads it and sets it
  // outside a session; a publish sets it under this set's lock, with the weights it names.
  const std::shared_ptr<WeightVersion>& version() const { return version_; }

  // The stored per-tensor digests, or with `recompute` the digests of the bytes resident now
  // (every resident byte is read, under the shared lock).
  RunnerChecksum checksum(Runner id, bool recompute = false) const;
  double digest_age_seconds(Runner id) const;
  // One digest of what the runners `selector` covers hold: each held runner's combined digest
  // (stored per-tensor digests), combined under the runner's name. Cheap (no byte is read); the
  // `runner_digest` of begin/end_weight_update, by which a trainer knows an engine still holds
  // exactly the last commit (delta updates).
  Digest covered_digest(Selector selector) const;
  std::size_t tensor_count(Runner id) const;

  // Read access by name for probes that use the weights. Returns false when absent.
  bool with_tensor(Runner id, const std::string& name,
                   const std::function<void(const ResidentTensor&)>& fn) const;

 private:
  // The runner's combined digest of its stored per-tensor digests, straight from its name-ordered
  // map (no names copied, nothing sorted).
  Digest combined_of(Runner id) const;
  struct Slot {
    RunnerConfig config;
    std::map<std::string, ResidentTensor> tensors;
    std::vector<Digest> rank_staged;
    std::chrono::steady_clock::time_point digest_time;
  };
  Slot* find(Runner id);
  const Slot* find(Runner id) const;
  // publish() in three steps: the staged tensors of each covered runner as resident tensors
  // (prepare); laid out, outside the lock (lay_out); swapped in under the lock (install_locked).
  struct Prepared;
  using StagedByRunner = std::map<Runner, std::map<std::string, StagedTensor>>;
  std::vector<Prepared> prepare(StagedByRunner staged, Selector selector) const;
  std::vector<RunnerCommit> lay_out(std::vector<Prepared>& prepared, bool legacy_finalize) const;
  void install_locked(std::vector<Prepared>& prepared, std::vector<RunnerCommit>& report,
                      bool legacy_finalize);
  const Slot& get(Runner id) const;

  const int rank_count_;
  const std::shared_ptr<BlockPool> pool_ = std::make_shared<BlockPool>();
  mutable std::shared_mutex mu_;
  std::vector<Slot> slots_;
  const std::shared_ptr<WeightVersion> version_;
  std::mutex pending_mu_;  // loads run on the committing thread, outside mu_
  // Loaded or adopted, not yet published: one map per runner, indexed by Runner, so that an
  // adoption allocates nothing (ReceiverRunner::adopt must not throw).
  std::array<std::map<std::string, StagedTensor>, 2> pending_;
  std::map<std::string, StagedTensor>& pending_of(Runner id) {
    return pending_[static_cast<std::size_t>(id)];
  }
};

// Applies `layout` to a tensor that is not laid out yet and refreshes its digest.
void finalize_tensor(Layout layout, ResidentTensor& tensor);

}  // namespace weightcast::sync::engine

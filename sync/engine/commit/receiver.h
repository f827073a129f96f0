// Receiver: one engine rank's side of weight updates (or several ranks of one process), as a
// library — no HTTP server, no model.
//
// An inference engine embeds one Receiver per rank (per TP worker process) and forwards the
// control plane's calls to it; weightcast-engine's control plane (sync/engine/control/engine.h) is
// built on one Receiver serving all of its ranks. The calls: join/leave a group (our store or
// torch's c10d store; Gloo chain, same-host single copy or NCCL, as
// sync/engine/receive/rendezvous.h decides), begin a session (selector, holder), receive bucket
// requests in every format (weightcast buckets, delta buckets, SGLang's per-tensor and flattened
// buckets), commit, abort. Buckets go through one receive pipeline
// (sync/engine/receive/receive_pipeline.h: pool blocks, double buffering, digests while the next
// bucket is on the wire) into this receiver's own Staging; nothing reaches the engine's weights
// before commit.
//
// Commit: every local rank's digest of every staged tensor must equal the first's, and (unless
// verify_at_commit is off) its bytes are hashed again and checked against the digest taken at
// receive, before the first `load`. Then each covered runner that received tensors gets `begin`,
// `load(views)` once per layer in layer order (sync/engine/commit/receiver_order.h), and `finish`
// (where an engine runs its post-load processing). The version changes only when every `load` and
// `finish` returned. A `load` or `finish` that throws fails the commit with a LoadError naming
// the runner and tensor; when deltas are on, the tensors already loaded in that commit are loaded
// again from the kept base (the previous version's bytes), so the engine's weights return to the
// previous version; either way the version does not change.
// Views passed to `load` point into staged pool blocks (host memory): zero copy, valid only
// during the call; a runner that keeps bytes copies them (param.copy_ does).
// Delta bases: with deltas on, the receiver keeps the raw bytes of the last committed tensors
// (sync/engine/commit/receiver_base.h) and reports their size: delta_base_bytes().
// Errors: misuse throws comm::EnforceError; refused or failed operations throw ReceiverError
// with the HTTP status the control plane would answer (409 state, 400 input, 504 timeout, 500).
// A failed receive or commit ends the session and discards staging; the previous weights stay.
// Parts: a ReceiverState (the session, groups, committed base and counters, under one lock), a
// BucketIntake (sync/engine/commit/bucket_intake.h: bucket requests of both paths into the open
// session); the Receiver itself joins groups, opens, commits and ends sessions.
// Lifetime: create with the rank's place and runners; destruction aborts groups and joins threads.
// Threading: every method is thread-safe; receive() blocks until its bucket is staged and several
// may wait at once; callbacks run on the thread that called commit() or install().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "sync/engine/commit/bucket_intake.h"
#include "sync/engine/commit/local_ranks.h"
#include "sync/engine/commit/open_session.h"
#include "sync/engine/commit/receiver_base.h"
#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/commit/receiver_state.h"
#include "sync/engine/commit/weight_version.h"
#include "sync/engine/control/group_table.h"
#include "sync/engine/control/session.h"
#include "sync/engine/receive/channel.h"
#include "sync/engine/receive/receive_pipeline.h"
#include "sync/engine/receive/segment_copy.h"
#include "sync/engine/runners/delta_base.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/name_filter.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/tensor_update.h"

namespace weightcast::sync::engine {

struct ReceiverOptions {
  ReceiverPlace place;
  comm::Millis init_timeout{60000};
  comm::Millis comm_timeout{60000};  // each bucket's broadcast
  std::size_t max_bucket_bytes = std::size_t{4} << 30;
  std::uint64_t max_buckets_ahead = 8;
  ConnectOptions connect;        // rank_count, init_timeout and base_gpu_id come from above
  bool keep_delta_base = false;  // deltas on: keep the last committed tensors' bytes
  std::string initial_version = "default";
  // Where the committed weight_version lives (sync/engine/commit/weight_version.h); null: the
  // receiver keeps its own, starting at initial_version.
  std::shared_ptr<WeightVersion> version;
  RankConnector connector = connect_rank;
  // Forms every local rank's channel at once (place.engine_rank 0, local_ranks == rank_count):
  // used instead of `connector` when set. weightcast-engine passes connect_group.
  GroupConnector group_connector;
  // Where buckets are received; null: the receiver's own pool. An in-process engine that keeps
  // staged blocks as its weights passes its pool, so replaced weights return their blocks.
  std::shared_ptr<BlockPool> pool;
  // The colocated path keeps its read-only mappings of trainer segments between updates while the
  // trainer keeps them (comm/colocate/segment_mappings.h); false: maps per bucket, reads with
  // pread.
  bool keep_segment_mappings = true;
  // Deltas against the engine's own weights instead of a kept copy (see DeltaBaseSource).
  DeltaBaseSource base_source;
  // Shard plans of a receiver serving several ranks (LocalRanksOptions::plans, docs/sharding.md):
  // each rank joins its shard class's groups and stages its slices; commit puts the full tensors
  // together. Empty: every rank receives whole tensors.
  std::vector<ShardPlan> shard_plans;
  // Expert parallelism: a receiver of one rank drops the routed experts its EP rank does not hold
  // (not staged, not loaded), as vLLM's and SGLang's MoE loaders do
  // (sync/engine/commit/local_ranks.h).
  ExpertParallel experts;
  // Commit hashes every staged byte again before the first load (memory that changed between
  // receive and commit is caught). Off: the digests taken while each bucket was hot, and checked
  // against the trainer's, stand; an engine that keeps the staged blocks themselves as its
  // weights (and can recompute their digests on request) saves a pass over every byte.
  bool verify_at_commit = true;
};

struct ReceiverBegin {
  std::string session_id;      // the session's token
  std::string weight_version;  // committed before this session
  std::string runner_digest;   // of the kept base; empty without one (no deltas then)
  // An adapter session: the adapter held under its name (the base of its deltas); empty: none.
  std::string lora_version;
  std::string lora_digest;
};

struct ReceiverCommit {
  Selector selector = Selector::kAll;  // the session's
  bool flush_requested = false;        // a bucket asked for a cache flush after commit
  std::string weight_version;
  std::vector<RunnerUpdateStats> runners;
  std::string runner_digest;
  std::size_t bytes_loaded = 0;
  std::string adapter;      // an adapter session's: the adapter swapped in (no runner loaded)
  std::string lora_digest;  // ... and its Adapter::combined_digest
};

// The open session as the control plane around a Receiver reads it.
struct SessionView {
  std::uint64_t id = 0;  // grows by one per begin: work of an older session is stale
  Selector selector = Selector::kAll;
  bool owned = false;        // its begin named a holder
  bool sessionless = false;  // opened for one update request (begin(..., sessionless))
  std::string holder_text;   // who holds it, for messages
};

// A commit's last step for an engine that makes what its runners loaded visible as one
// transaction (weightcast-engine's RunnerSet): called once every runner loaded, with the session's
// selector and the version to set (none: unchanged), and sets that version itself. A throw fails
// the commit; the version stays.
using PublishFn = std::function<void(Selector, const std::optional<std::string>&)>;

class Receiver {
 public:
  Receiver(ReceiverOptions opts, std::vector<ReceiverRunner> runners);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  const ReceiverPlace& place() const { return ranks_.place(); }

  // Joins `spec`'s group as engine rank place().engine_rank (group rank rank_offset + it),
  // replacing an idle group of that name; bounded by init_timeout.
  void join(const GroupSpec& spec);
  // Leaves the group; returns whether that ended the open session (it relied on the group).
  bool leave(const std::string& group_name);
  std::vector<std::string> groups() const;

  // Opens the session (sync/engine/control/session.h: the one state machine of the engine side).
  // `sessionless`: the one-request session an engine opens itself for an update that arrives with
  // no session open; only calls carrying its token act on it.
  // `adapter`: an adapter session (sync/engine/lora/adapter_session.h): its commit swaps the
  // adapter into adapters() and loads no runner.
  ReceiverBegin begin(Selector selector, std::optional<std::string> holder = std::nullopt,
                      bool sessionless = false,
                      std::optional<AdapterTarget> adapter = std::nullopt);
  // The open session, or none.
  std::optional<SessionView> session() const;
  bool sessionless() const;
  // Generation paused (pause_generation), kept by the session machine beside the session.
  bool paused() const;
  void set_paused(bool paused);
  // Whether a call from `route` carrying `token` may act on the open session (nothing changes).
  std::optional<Refusal> check_owner(const std::optional<std::string>& token,
                                     std::string_view route) const;
  // Ends session `id` as abort() does, if it is still the open one; returns whether it did.
  bool abort_session(std::uint64_t id, const std::string& reason, int status,
                     bool abort_used_groups);
  // Receives one bucket request's data and stages it; returns the bytes staged.
  std::size_t receive(const UpdateWeightsFromDistributedRequest& request);
  // receive() in two steps, for a control plane that checks and words its own answers: submit()
  // queues the request on its group (a refusal throws ReceiverError and changes nothing); wait()
  // blocks until it is staged. A failure after submit ends the session (and, for a broken group,
  // aborts the group) and is returned instead of thrown.
  // A bucket of a group none of this receiver's ranks joined (InitWeightsUpdateGroupRequest::
  // ranks) has no job: wait() answers it at once, with 0 bytes.
  using Ticket = BucketIntake::Ticket;
  Ticket submit(const UpdateWeightsFromDistributedRequest& request);
  // The colocated path (docs/colocated.md): stages one bucket copied out of the trainer's shared
  // segment (sync/engine/receive/segment_copy.h) under the same session, selector and owner
  // checks as a bucket request; returns the bytes staged. A refused or failed copy stages
  // nothing and leaves the session as it was (ReceiverError: 400 for a handle, segment or bytes
  // that are not what the request says, 504 when the trainer does not hand the segment over).
  // `handle_token`: the token the trainer's handle must carry when it is not this receiver's
  // session token (a worker behind an engine front whose session the front owns).
  std::size_t receive_segment(const UpdateWeightsFromTensorRequest& request,
                              const std::optional<std::string>& handle_token = std::nullopt);
  // The same for a bucket already in this process's memory (parse_local_bucket's request and its
  // bytes): the pickled form a Python receiver decoded, opted in. Digests are computed here.
  std::size_t receive_local(const UpdateWeightsFromTensorRequest& request,
                            std::span<const std::byte> bytes);
  ReceiveOutcome wait(const Ticket& ticket);
  // update_weight_version: staged for commit inside a session (returns false), applied at once
  // outside one (returns true). A session_id whose session is not open is refused.
  bool set_version(const std::string& version, const std::optional<std::string>& session_id = {});
  // Commits the open session (owner-checked with `session_id`): every rank's copies checked
  // once, loaded, then `publish` (when given) makes them visible and sets the version.
  ReceiverCommit commit(const std::optional<std::string>& version = std::nullopt,
                        const std::optional<std::string>& session_id = std::nullopt,
                        const PublishFn& publish = {});
  // Ends the open session without loading anything (no-op without one). Groups with a bucket in
  // flight are aborted with `status` (their peers are out of step); `abort_used_groups`: every
  // group that took a bucket of the session as well (its trainer is gone).
  void abort(const std::string& reason = "aborted", int status = 409,
             bool abort_used_groups = false);
  // Aborts every group with `status` (the engine is shutting down); the groups stay joined.
  void abort_groups(int status, const std::string& reason);
  // Whether any group has buckets queued or in flight, or a colocated bucket is being copied.
  bool busy() const;
  // The joined groups, for readers (server info, metrics).
  GroupTable::Groups joined() const;

  // Initial weights of `runner`, through the same begin/load/finish path (outside a session);
  // recorded as committed (digests, and the delta base when kept). Also reserves (pre-faults)
  // staging memory for one full update of these tensors.
  void install(Runner runner, const std::vector<TensorMeta>& metas,
               const std::vector<std::span<const std::byte>>& bytes);

  bool in_session() const;
  std::optional<Selector> session_selector() const;
  std::string weight_version() const;
  void set_keep_delta_base(bool keep);
  bool keeps_delta_base() const;
  std::size_t delta_base_bytes() const;
  // Name -> digest of the raw tensors `runner` last loaded (initial or committed).
  std::map<std::string, Digest> digests(Runner runner) const;
  std::vector<Runner> runners() const;
  const NameFilter& filter(Runner runner) const;
  // Bytes that came in on the data plane since start: the groups' broadcasts and the colocated
  // copies (receive_segment).
  std::uint64_t bytes_received() const;
  // Expert parallelism: each local rank's experts (empty without), and the routed expert tensors
  // this receiver dropped as not its rank's since it started.
  const std::vector<ExpertPlacement>& expert_placements() const { return ranks_.placements(); }
  std::uint64_t experts_dropped() const;
  // Host memory of the staging pool (blocks in use and pooled), sync/engine/stage/block_pool.h.
  std::size_t staging_pool_bytes() const { return pool_->stats().allocated_bytes; }
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }
  // The adapters committed adapter sessions swapped in (docs/lora.md).
  const AdapterStore& adapters() const { return adapters_; }
  bool unload_adapter(const std::string& name) { return adapters_.unload(name); }

 private:
  const ReceiverRunner* find(Runner id) const;
  // Every rank's staged copies checked (and, with plans, put together into the runners' full
  // shapes) before a commit loads them: LocalRanks::verify.
  void check_staged(std::map<Runner, std::map<std::string, StagedTensor>>& staged) const;
  ReceiverCommit commit_adapter(SessionTaken& taken);

  const ReceiverOptions opts_;
  const std::vector<ReceiverRunner> runners_;
  const std::shared_ptr<BlockPool> pool_;
  const LocalRanks ranks_;
  std::mutex commit_mu_;  // one commit or install at a time (callbacks run without the state's)
  ReceiverState state_;   // session, groups, committed base, counters: under state_.mu
  const std::shared_ptr<WeightVersion> version_;
  AdapterStore adapters_;
  BucketIntake intake_;  // bucket requests into the open session
};

}  // namespace weightcast::sync::engine

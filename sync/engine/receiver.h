// Receiver: one engine rank's side of weight updates, as a library — no HTTP server, no model.
//
// An inference engine embeds one Receiver per rank (per TP worker process) and forwards the
// control plane's calls to it: join/leave a group (our store or torch's c10d store; Gloo chain,
// same-host single copy or NCCL, as sync/engine/rendezvous.h decides), begin a session (selector,
// holder), receive bucket requests in every format (weightcast buckets, delta buckets, SGLang's
// per-tensor and flattened buckets), commit, abort. Buckets go through the same receive pipeline
// as weightcast-engine (sync/engine/group.h: pool blocks, double buffering, digests while the
// next bucket is on the wire) into this rank's own Staging; nothing reaches the engine's weights
// before commit.
//
// Commit: every staged tensor's bytes are hashed again and checked against the digest taken at
// receive, before the first `load`. Then each covered runner that received tensors gets `begin`,
// `load(views)` once per layer in layer order (sync/engine/receiver_order.h), and `finish` (where
// an engine runs its post-load processing). The version changes only when every `load` and
// `finish` returned. A `load` or `finish` that throws fails the commit with a LoadError naming
// the runner and tensor; when deltas are on, the tensors already loaded in that commit are loaded
// again from the kept base (the previous version's bytes), so the engine's weights return to the
// previous version; either way the version does not change.
// Views passed to `load` point into staged pool blocks (host memory): zero copy, valid only
// during the call; a runner that keeps bytes copies them (param.copy_ does).
// Delta bases: with deltas on, the receiver keeps the raw bytes of the last committed tensors
// (sync/engine/receiver_base.h) and reports their size: delta_base_bytes().
// Errors: misuse throws comm::EnforceError; refused or failed operations throw ReceiverError
// with the HTTP status the control plane would answer (409 state, 400 input, 504 timeout, 500).
// A failed receive or commit ends the session and discards staging; the previous weights stay.
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
#include <set>
#include <span>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "sync/engine/channel.h"
#include "sync/engine/group.h"
#include "sync/engine/group_table.h"
#include "sync/engine/receiver_base.h"
#include "sync/engine/receiver_loader.h"
#include "sync/engine/session.h"
#include "sync/engine/staging.h"
#include "sync/model/name_filter.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

// Where this rank lives: its index among the engine's ranks and its device.
struct ReceiverPlace {
  int engine_rank = 0;
  int rank_count = 1;
  int cuda_device = -1;  // -1: host memory (Gloo); else the CUDA ordinal NCCL groups use
};

// Forms this rank's channel of a group (tests plug in fake channels).
using RankConnector = std::function<std::unique_ptr<BucketChannel>(
    const GroupSpec&, const ConnectOptions&, int engine_rank)>;

// The real connector: rendezvous detection and join_rank() (sync/engine/rendezvous.h).
std::unique_ptr<BucketChannel> connect_rank(const GroupSpec& spec, const ConnectOptions& opts,
                                            int engine_rank);

struct ReceiverOptions {
  ReceiverPlace place;
  comm::Millis init_timeout{60000};
  comm::Millis comm_timeout{60000};  // each bucket's broadcast
  std::size_t max_bucket_bytes = std::size_t{4} << 30;
  std::uint64_t max_buckets_ahead = 8;
  ConnectOptions connect;        // rank_count, init_timeout and base_gpu_id come from above
  bool keep_delta_base = false;  // deltas on: keep the last committed tensors' bytes
  std::string initial_version = "default";
  RankConnector connector = connect_rank;
};

struct ReceiverBegin {
  std::string session_id;      // the session's token
  std::string weight_version;  // committed before this session
  std::string runner_digest;   // of the kept base; empty without one (no deltas then)
};

struct ReceiverCommit {
  std::string weight_version;
  std::vector<RunnerUpdateStats> runners;
  std::string runner_digest;
  std::size_t bytes_loaded = 0;
};

class Receiver {
 public:
  Receiver(ReceiverOptions opts, std::vector<ReceiverRunner> runners);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  const ReceiverPlace& place() const { return opts_.place; }

  // Joins `spec`'s group as engine rank place().engine_rank (group rank rank_offset + it),
  // replacing an idle group of that name; bounded by init_timeout.
  void join(const GroupSpec& spec);
  void leave(const std::string& group_name);
  std::vector<std::string> groups() const;

  ReceiverBegin begin(Selector selector, std::optional<std::string> holder = std::nullopt);
  // Receives one bucket request's data and stages it; returns the bytes staged.
  std::size_t receive(const UpdateWeightsFromDistributedRequest& request);
  // update_weight_version: staged for commit inside a session, applied at once outside one.
  void set_version(const std::string& version, const std::optional<std::string>& session_id = {});
  ReceiverCommit commit(const std::optional<std::string>& version = std::nullopt,
                        const std::optional<std::string>& session_id = std::nullopt);
  // Ends the open session without loading anything (no-op without one).
  void abort(const std::string& reason = "aborted");

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
  std::uint64_t bytes_received() const;
  // Host memory of the staging pool (blocks in use and pooled), sync/engine/block_pool.h.
  std::size_t staging_pool_bytes() const { return pool_->stats().allocated_bytes; }

 private:
  struct Submitted {
    std::shared_ptr<BucketJob> job;
    std::shared_ptr<Group> group;
    std::uint64_t session_id = 0;
  };
  Submitted submit_locked(const UpdateWeightsFromDistributedRequest& request);
  std::shared_ptr<const DeltaSpec> delta_spec_locked(const BucketDelta& delta) const;
  void fail_session_locked(std::uint64_t session_id, bool abort_busy_groups, int status,
                           const std::string& reason);
  const ReceiverRunner* find(Runner id) const;

  const ReceiverOptions opts_;
  const std::vector<ReceiverRunner> runners_;
  const std::shared_ptr<BlockPool> pool_ = std::make_shared<BlockPool>();
  mutable std::mutex mu_;
  std::mutex commit_mu_;  // one commit or install at a time (callbacks run without mu_)
  SessionMachine session_;
  std::shared_ptr<Staging> staging_;
  std::set<std::string> session_names_;
  GroupTable groups_;
  ReceiverBase base_;
  std::string version_;
  bool committing_ = false;  // a commit is loading: no new session may begin
};

}  // namespace weightcast::sync::engine

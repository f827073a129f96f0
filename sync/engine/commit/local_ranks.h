// LocalRanks: the engine ranks one Receiver serves, and what depends only on them — how they join
// a group and how their staged copies are checked against each other before a commit loads.
//
// A receiver serves one rank (a TP worker process) or several consecutive ranks of one process
// (weightcast-engine serves all of its own). Joining forms one channel per local rank, with the
// rank connector (one rank) or a group connector (every rank at once), and wraps them in a Group
// receiving into the receiver's pool. Every local rank records the digest of each tensor it
// received; the first one's bytes are staged, and verify() checks every other rank's digest
// against them (and, asked to, rehashes the staged bytes) so nothing differs between ranks.
// Lifetime: owned by one Receiver. Threading: const and thread-safe; form() blocks up to the
// init timeout and must run without the receiver's lock.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/deadline.h"
#include "sync/engine/commit/slice_assembly.h"
#include "sync/engine/receive/channel.h"
#include "sync/engine/receive/receive_pipeline.h"
#include "sync/engine/stage/block_pool.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/expert_placement.h"
#include "sync/model/shard_plan.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync::engine {

// Where this rank lives: its index among the engine's ranks and its device. One receiver may
// serve several consecutive ranks of one process: engine ranks engine_rank .. engine_rank +
// local_ranks - 1. Their bytes are staged once (the first local rank's); the others' digests are
// checked against it at commit.
struct ReceiverPlace {
  int engine_rank = 0;
  int rank_count = 1;
  int cuda_device = -1;  // -1: host memory (Gloo); else the CUDA ordinal NCCL groups use
  int local_ranks = 1;
};

// Forms this rank's channel of a group (tests plug in fake channels).
using RankConnector = std::function<std::unique_ptr<BucketChannel>(
    const GroupSpec&, const ConnectOptions&, int engine_rank)>;

// The real connector: rendezvous detection and join_rank() (sync/engine/receive/rendezvous.h).
std::unique_ptr<BucketChannel> connect_rank(const GroupSpec& spec, const ConnectOptions& opts,
                                            int engine_rank);

// Expert parallelism (sync/model/expert_placement.h): with ep_size > 1 each engine rank holds the
// routed experts of its EP rank (SGLang: tp_rank / (tp_size / ep_size)) and drops the others.
struct ExpertParallel {
  int ep_size = 1;
  int num_experts = 0;  // of the model; required with ep_size > 1
  PlacementStrategy strategy = PlacementStrategy::kLinear;
};

struct LocalRanksOptions {
  ReceiverPlace place;
  comm::Millis init_timeout{60000};
  comm::Millis comm_timeout{60000};
  std::uint64_t max_buckets_ahead = 8;
  ConnectOptions connect;
  RankConnector connector;          // one local rank
  GroupConnector group_connector;   // every engine rank at once; used when set
  std::shared_ptr<BlockPool> pool;  // where buckets are received
  ExpertParallel experts;
  // Shard plans of a receiver serving several ranks (docs/sharding.md): local rank i's at index
  // i, each rank joining its class's groups and staging its slices (assembled at commit,
  // sync/engine/commit/slice_assembly.h). Empty: every rank receives whole tensors. A receiver of
  // one rank needs none: it stages what it receives, slices included.
  std::vector<ShardPlan> plans;
};

class LocalRanks {
 public:
  explicit LocalRanks(LocalRanksOptions opts);

  const ReceiverPlace& place() const { return opts_.place; }
  int count() const { return opts_.place.local_ranks; }
  // "engine rank 2" or "engine ranks 0..3".
  std::string describe() const;
  int ep_size() const { return opts_.experts.ep_size; }
  // Each local rank's experts (empty without expert parallelism), local rank order.
  const std::vector<ExpertPlacement>& placements() const { return placements_; }
  // Whether this receiver drops `name`: a routed expert's tensor that its one rank does not hold.
  // A receiver serving several ranks of one process drops nothing (its runners are the whole
  // engine's, shared by its ranks).
  bool drops(std::string_view name) const;

  // Whether these ranks join `spec`'s group: it names no ranks (every rank joins) or some of
  // these (GroupSpec::ranks).
  bool joins(const GroupSpec& spec) const;
  // Checks `spec` against the ranks (400), forms their channels and the Group over them; throws
  // ReceiverError: 504 when the group did not form within the init timeout, 400 for a
  // configuration error, else 500. A group naming ranks must name this receiver's one rank, or,
  // when it serves several, all of them, or (with plans) consecutive ranks of one shard class
  // (400 otherwise).
  std::shared_ptr<Group> form(const GroupSpec& spec) const;

  // Whether the ranks stage slices by plans (LocalRanksOptions::plans).
  bool sliced() const { return !opts_.plans.empty(); }
  // What the ranks of a joined group keep (they share one plan): null for a group of every rank,
  // or without plans.
  const ShardPlan* plan_of(const GroupSpec& joined) const;

  // Every local rank staged the same bytes of every tensor in `staged` (with plans: its slices,
  // put together into full tensors of `full_shape`'s shapes, sync/engine/commit/slice_assembly.h);
  // with `rehash`, the staged bytes still hash to what was taken at receive. Throws
  // ReceiverError(500) naming the first rank, runner and tensor that do not.
  void verify(std::map<Runner, std::map<std::string, StagedTensor>>& staged, bool rehash,
              const FullShape& full_shape) const;

 private:
  GroupSpec as_joined(const GroupSpec& requested) const;
  // Listed ranks of a receiver serving several with plans: consecutive, these, one plan (400).
  void check_class_ranks(const std::vector<int>& ranks) const;
  std::vector<std::unique_ptr<BucketChannel>> connect(const GroupSpec& spec) const;

  const LocalRanksOptions opts_;
  std::vector<ExpertPlacement> placements_;
};

}  // namespace weightcast::sync::engine

#include "sync/engine/commit/local_ranks.h"

#include <algorithm>
#include <numeric>

#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/receive/rendezvous.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::engine {

namespace {

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

LocalRanks::LocalRanks(LocalRanksOptions opts) : opts_(std::move(opts)) {
  const ReceiverPlace& p = opts_.place;
  WC_ENFORCE_GT(p.rank_count, 0, "engine rank count");
  WC_ENFORCE(p.engine_rank >= 0 && p.engine_rank < p.rank_count, "engine rank ", p.engine_rank,
             " of ", p.rank_count);
  WC_ENFORCE(p.local_ranks >= 1 && p.engine_rank + p.local_ranks <= p.rank_count, "local ranks ",
             p.local_ranks, " from engine rank ", p.engine_rank, " of ", p.rank_count);
  WC_ENFORCE(p.local_ranks == 1 || static_cast<bool>(opts_.group_connector),
             "several local ranks are joined by a group connector");
  WC_ENFORCE(!opts_.group_connector || (p.engine_rank == 0 && p.local_ranks == p.rank_count),
             "a group connector joins every engine rank: engine_rank 0, local_ranks ", p.rank_count,
             " (got ", p.engine_rank, ", ", p.local_ranks, ")");
  WC_ENFORCE(p.cuda_device >= -1, "cuda_device: -1 (host) or a CUDA ordinal");
  WC_ENFORCE_GT(opts_.comm_timeout.count(), 0);
  WC_ENFORCE_GT(opts_.init_timeout.count(), 0);
  WC_ENFORCE_GT(opts_.max_buckets_ahead, std::uint64_t{0});
  WC_ENFORCE(opts_.connector || opts_.group_connector, "a rank connector is required");
  WC_ENFORCE(opts_.pool != nullptr, "a receive pool is required");
  WC_ENFORCE(opts_.plans.empty() || static_cast<int>(opts_.plans.size()) == p.local_ranks,
             "shard plans: one per local rank (", p.local_ranks, "), got ", opts_.plans.size());
  const ExpertParallel& ep = opts_.experts;
  if (ep.ep_size > 1) {
    if (ep.num_experts < ep.ep_size) {
      throw comm::ConfigError("ep_size " + std::to_string(ep.ep_size) +
                              " needs a model with at least as many routed experts (it has " +
                              std::to_string(ep.num_experts) + ")");
    }
    for (int r = p.engine_rank; r < p.engine_rank + p.local_ranks; ++r) {
      placements_.emplace_back(ep.num_experts, ep.ep_size,
                               ep_rank_of_tp_rank(r, p.rank_count, ep.ep_size), ep.strategy);
    }
  } else {
    WC_ENFORCE_EQ(ep.ep_size, 1, "ep_size");
  }
}

bool LocalRanks::drops(std::string_view name) const {
  return placements_.size() == 1 && !placements_[0].accepts(name);
}

std::string LocalRanks::describe() const {
  const ReceiverPlace& p = opts_.place;
  if (p.local_ranks == 1) return "engine rank " + std::to_string(p.engine_rank);
  return "engine ranks " + std::to_string(p.engine_rank) + ".." +
         std::to_string(p.engine_rank + p.local_ranks - 1);
}

std::vector<std::unique_ptr<BucketChannel>> LocalRanks::connect(const GroupSpec& spec) const {
  const ReceiverPlace& p = opts_.place;
  ConnectOptions connect = opts_.connect;
  connect.rank_count = p.rank_count;
  connect.init_timeout = opts_.init_timeout;
  if (opts_.group_connector) {
    if (!spec.ranks.empty()) {  // a shard class's consecutive ranks (as_joined)
      connect.rank_count = static_cast<int>(spec.ranks.size());
      connect.base_gpu_id += spec.ranks.front();
    }
    return opts_.group_connector(spec, connect);
  }
  // join_rank() drives device base_gpu_id + engine rank.
  connect.base_gpu_id = p.cuda_device >= 0 ? p.cuda_device - p.engine_rank : 0;
  std::vector<std::unique_ptr<BucketChannel>> channels;
  channels.push_back(opts_.connector(spec, connect, p.engine_rank));
  return channels;
}

bool LocalRanks::joins(const GroupSpec& spec) const {
  const int first = opts_.place.engine_rank;
  return spec.ranks.empty() || std::any_of(spec.ranks.begin(), spec.ranks.end(), [&](int r) {
           return r >= first && r < first + opts_.place.local_ranks;
         });
}

// `requested` as the connectors take it: every rank of the engine at rank_offset + its engine
// rank. A one-rank receiver listed at index i of `ranks` joins at group rank rank_offset + i, so
// its offset moves by i - engine_rank; a receiver serving several ranks takes all or none.
GroupSpec LocalRanks::as_joined(const GroupSpec& requested) const {
  const ReceiverPlace& p = opts_.place;
  GroupSpec spec = requested;
  if (spec.ranks.empty()) return spec;
  const auto room = static_cast<std::int64_t>(spec.world_size) - spec.rank_offset;
  if (static_cast<std::int64_t>(spec.ranks.size()) > room) {
    throw ReceiverError(400, "world_size: " + std::to_string(spec.world_size) +
                                 " leaves no room for the " + std::to_string(spec.ranks.size()) +
                                 " ranks listed at rank_offset " +
                                 std::to_string(spec.rank_offset));
  }
  std::vector<int> all(static_cast<std::size_t>(p.rank_count));
  std::iota(all.begin(), all.end(), 0);
  if (spec.ranks == all) {
    spec.ranks.clear();
    return spec;
  }
  if (p.local_ranks > 1 && !sliced()) {
    throw ReceiverError(400, "ranks: " + describe() +
                                 " served by one receiver join a group all together; this one "
                                 "lists only some of them");
  }
  if (p.local_ranks > 1) {
    check_class_ranks(spec.ranks);
    return spec;  // ranks[i] joins at group rank rank_offset + i
  }
  const auto at = std::find(spec.ranks.begin(), spec.ranks.end(), p.engine_rank);
  WC_ENFORCE(at != spec.ranks.end(), "engine rank ", p.engine_rank, " is not listed in ranks");
  spec.rank_offset += static_cast<int>(at - spec.ranks.begin()) - p.engine_rank;
  return spec;
}

void LocalRanks::check_class_ranks(const std::vector<int>& ranks) const {
  const ReceiverPlace& p = opts_.place;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < p.engine_rank || r >= p.engine_rank + p.local_ranks) {
      throw ReceiverError(400, "ranks[" + std::to_string(i) + "]: " + std::to_string(r) +
                                   " is not one of " + describe());
    }
    if (i > 0 && r != ranks[i - 1] + 1) {
      throw ReceiverError(400, "ranks: " + describe() +
                                   " join a shard class's group as consecutive ranks; ranks[" +
                                   std::to_string(i) + "] is " + std::to_string(r) + " after " +
                                   std::to_string(ranks[i - 1]));
    }
    const ShardPlan& plan = opts_.plans[static_cast<std::size_t>(r - p.engine_rank)];
    const ShardPlan& first = opts_.plans[static_cast<std::size_t>(ranks[0] - p.engine_rank)];
    if (plan != first) {
      throw ReceiverError(400, "ranks: engine ranks " + std::to_string(ranks[0]) + " and " +
                                   std::to_string(r) +
                                   " keep different slices (shard plans), so they are not one "
                                   "shard class's group");
    }
  }
}

const ShardPlan* LocalRanks::plan_of(const GroupSpec& joined) const {
  if (!sliced() || joined.ranks.empty()) return nullptr;
  return &opts_.plans[static_cast<std::size_t>(joined.ranks.front() - opts_.place.engine_rank)];
}

std::shared_ptr<Group> LocalRanks::form(const GroupSpec& requested) const {
  const ReceiverPlace& p = opts_.place;
  const GroupSpec spec = as_joined(requested);
  if (requested.rank_offset < 1) {
    throw ReceiverError(400, "rank_offset: must be >= 1, group rank 0 is the source (got " +
                                 std::to_string(requested.rank_offset) + ")");
  }
  if (requested.ranks.empty() &&
      static_cast<std::int64_t>(spec.rank_offset) + p.rank_count > spec.world_size) {
    throw ReceiverError(400, "world_size: " + std::to_string(spec.world_size) +
                                 " leaves no room for this engine's " +
                                 std::to_string(p.rank_count) + " ranks at rank_offset " +
                                 std::to_string(spec.rank_offset));
  }
  try {
    GroupOptions gopts;
    gopts.comm_timeout = opts_.comm_timeout;
    gopts.max_ahead = opts_.max_buckets_ahead;
    gopts.pool = opts_.pool;
    gopts.engine_rank = p.engine_rank;
    if (p.local_ranks > 1 && !spec.ranks.empty())
      gopts.first_rank = spec.ranks.front() - p.engine_rank;
    return std::make_shared<Group>(spec, connect(spec), gopts);
  } catch (const std::exception& e) {
    const int status = join_status(e);
    throw ReceiverError(status,
                        "group '" + spec.group_name + "' " +
                            (status == 504 ? "did not form within " +
                                                 std::to_string(opts_.init_timeout.count()) + " ms"
                                           : "could not be joined") +
                            " as " + describe() + ": " + e.what());
  }
}

void LocalRanks::verify(std::map<Runner, std::map<std::string, StagedTensor>>& staged, bool rehash,
                        const FullShape& full_shape) const {
  const int first_rank = opts_.place.engine_rank;
  if (sliced()) {
    assemble_slices(staged, opts_.plans, full_shape, *opts_.pool, rehash, first_rank);
    return;
  }
  if (auto d = find_rank_disagreement(staged, static_cast<std::size_t>(count()))) {
    throw ReceiverError(
        500,
        "engine rank " + std::to_string(first_rank + static_cast<int>(d->rank)) + ": runner '" +
            std::string(to_string(d->runner)) + "': tensor '" + d->tensor +
            (d->missing ? "' was not received by this rank"
                        : "' differs from engine rank " + std::to_string(first_rank) + "'s copy") +
            "; nothing loaded, weight_version unchanged");
  }
  if (!rehash) return;
  for (const auto& [id, tensors] : staged) {
    for (const auto& [name, t] : tensors) {
      if (tensor_digest(t.bytes) != *t.rank_digests[0]) {
        throw ReceiverError(500, "commit: staged bytes of tensor '" + name + "' for runner '" +
                                     std::string(to_string(id)) +
                                     "' no longer match their digest at receive; nothing loaded, "
                                     "weight_version unchanged");
      }
    }
  }
}

}  // namespace weightcast::sync::engine

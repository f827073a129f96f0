#include "sync/engine/control/engine.h"

#include "comm/errors.h"
#include "sync/engine/runners/delta_base.h"

namespace weightcast::sync::engine {

namespace {

// The data plane of all of the engine's ranks in this process: one Receiver over every rank,
// loading into the runner set and rebuilding delta bases from its committed weights.
std::unique_ptr<Receiver> make_receiver(const EngineOptions& opts, RunnerSet* set) {
  WC_ENFORCE(set != nullptr);
  RunnerSet& runners = *set;
  WC_ENFORCE_EQ(runners.rank_count(), opts.rank_count, "runner set built for another rank count");
  WC_ENFORCE(static_cast<bool>(opts.connector), "a group connector is required");
  ReceiverOptions r;
  r.place.rank_count = opts.rank_count;
  r.place.local_ranks = opts.rank_count;
  r.init_timeout = opts.init_timeout;
  r.comm_timeout = opts.comm_timeout;
  r.max_bucket_bytes = opts.max_bucket_bytes;
  r.max_buckets_ahead = opts.max_buckets_ahead;
  r.connect = opts.connect;
  r.version = runners.version();  // one weight_version: the runner set's, set as it publishes
  r.group_connector = opts.connector;
  r.experts = opts.experts;
  r.shard_plans = opts.shard_plans;
  r.pool = runners.block_pool();
  r.keep_segment_mappings = opts.keep_segment_mappings;
  r.base_source = [&runners](const BucketPlan& plan,
                             const std::vector<std::vector<Runner>>& destinations,
                             const std::vector<Digest>& expected, const std::string& base_version,
                             std::span<std::byte> bucket, const ShardPlan* slices) {
    return fill_delta_base(runners, plan, destinations, expected, base_version, bucket, slices);
  };
  // The runners keep the staged blocks as their weights and recompute digests on request
  // (/weights_checksum?recompute): the digests taken at receive stand.
  r.verify_at_commit = false;
  std::vector<ReceiverRunner> loaders;
  for (Runner id : runners.runners()) loaders.push_back(runners.receiver_runner(id));
  return std::make_unique<Receiver>(std::move(r), std::move(loaders));
}

}  // namespace

EngineCore::EngineCore(EngineOptions opts, std::unique_ptr<RunnerSet> runners)
    : opts_(std::move(opts)),
      runners_(std::move(runners)),
      receiver_(make_receiver(opts_, runners_.get())),
      context_(opts_, *runners_, *receiver_) {}

Engine::Engine(EngineOptions opts, std::unique_ptr<RunnerSet> runners)
    : EngineCore(std::move(opts), std::move(runners)),
      SessionRoutes(context_),
      BucketRoutes(context_),
      EngineReaders(context_),
      watchdog_(context_) {
  // The runners, rank count, timeouts and connector were checked by make_receiver() and the
  // Receiver it built; the session timeout is the engine's own.
  WC_ENFORCE_GT(opts_.session_timeout.count(), 0);
}

// The watchdog stops first (the only member), then the parts, then receiver_ aborts its groups and
// joins their threads.
Engine::~Engine() = default;

void Engine::shutdown() {
  std::lock_guard lock(context_.mu);
  if (auto open = receiver_->session()) {
    context_.fail_session_locked(open->id, "engine shutting down", /*abort_groups=*/true, 503);
  }
  receiver_->abort_groups(503, "engine shutting down");
}

}  // namespace weightcast::sync::engine

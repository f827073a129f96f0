// StageGroups: the data-plane groups a DistributedUpdater sends each pipeline stage on: one group
// of every chain engine per stage (sync/trainer/group.h), or, while sharding, one group per shard
// class (sync/trainer/sharded_stage.h). A stage's groups are formed again when one broke (a
// failed update aborts its communicator), when the engine set's epoch changed, or when sharding
// started or stopped; engines that left the set are not asked to leave (one that is gone would
// only cost a timeout).
// Lifetime: owns the groups; destroy() (the updater's destructor) asks live members to leave.
// Threading: one caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "comm/non_copyable.h"
#include "sync/trainer/delta_source.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/group.h"
#include "sync/trainer/shard_classes.h"
#include "sync/trainer/sharded_stage.h"

namespace weightcast::sync::trainer {

class StageGroups : comm::NonCopyable {
 public:
  // Whether engine e is still in the set (may be asked to leave a group).
  using Alive = std::function<bool(std::size_t)>;

  // `engines`: the updater's engines (indices in `chain` and the classes refer to them); the
  // codec and mode of the class groups' delta bases.
  StageGroups(std::span<EngineApi* const> engines, DeltaCodec codec, DeltaMode delta);
  ~StageGroups();

  // Stage `stage`'s groups for `chain` (engine indices, in order; rank_counts[e] each) in
  // `epoch`, formed with `options` where they are missing or stale (see above). `classes` set:
  // one group per class; unset: one group of `chain` (none when `chain` is empty: every engine
  // takes the colocated path).
  void ensure(int stage, const std::vector<std::size_t>& chain, std::span<const int> rank_counts,
              const std::optional<std::vector<ShardClass>>& classes, const GroupOptions& options,
              std::uint64_t epoch, const Alive& alive);
  // Whether ensure() ran for `stage`.
  bool ensured(int stage) const;
  // The stage's one group (null while sharding or when every engine is colocated).
  WeightGroup* group(int stage) const;
  // The stage's class groups (null unless sharding).
  ShardedStage* sharded(int stage) const;
  // Every group's live members leave it; the groups are torn down.
  void destroy(const Alive& alive);

 private:
  struct Stage {
    std::unique_ptr<WeightGroup> group;
    std::uint64_t epoch = 0;
    std::vector<std::size_t> members;  // of `group`
    std::unique_ptr<ShardedStage> sharded;
  };
  void drop_group(Stage& stage, const Alive& alive);

  std::span<EngineApi* const> engines_;
  const DeltaCodec codec_;
  const DeltaMode delta_;
  std::vector<Stage> stages_;
};

}  // namespace weightcast::sync::trainer

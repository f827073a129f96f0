#include "sync/trainer/stage_groups.h"

#include "comm/errors.h"

namespace weightcast::sync::trainer {

StageGroups::StageGroups(std::span<EngineApi* const> engines, DeltaCodec codec, DeltaMode delta)
    : engines_(engines), codec_(codec), delta_(delta) {}

StageGroups::~StageGroups() = default;

void StageGroups::drop_group(Stage& stage, const Alive& alive) {
  if (!stage.group) return;
  std::vector<EngineApi*> live;
  for (std::size_t e : stage.members) {
    if (alive(e)) live.push_back(engines_[e]);
  }
  stage.group->destroy(live);
  stage.group.reset();
}

void StageGroups::ensure(int stage, const std::vector<std::size_t>& chain,
                         std::span<const int> rank_counts,
                         const std::optional<std::vector<ShardClass>>& classes,
                         const GroupOptions& options, std::uint64_t epoch, const Alive& alive) {
  WC_ENFORCE_GE(stage, 0);
  const auto index = static_cast<std::size_t>(stage);
  if (stages_.size() <= index) stages_.resize(index + 1);
  Stage& s = stages_[index];
  if (classes) {
    drop_group(s, alive);
    if (!s.sharded) s.sharded = std::make_unique<ShardedStage>(codec_, delta_);
    s.sharded->ensure(*classes, engines_, options, epoch, alive);
    return;
  }
  if (s.sharded) {
    s.sharded->destroy(engines_, alive);
    s.sharded.reset();
  }
  if (s.group ? !s.group->broken() && s.epoch == epoch && s.members == chain : chain.empty()) {
    return;
  }
  drop_group(s, alive);
  s.members = chain;
  if (chain.empty()) return;
  std::vector<int> counts;
  std::vector<EngineApi*> members;
  for (std::size_t e : chain) {
    counts.push_back(rank_counts[e]);
    members.push_back(engines_[e]);
  }
  s.group = WeightGroup::create(members, counts, options);
  s.epoch = epoch;
}

bool StageGroups::ensured(int stage) const {
  return stage >= 0 && static_cast<std::size_t>(stage) < stages_.size();
}

WeightGroup* StageGroups::group(int stage) const {
  return ensured(stage) ? stages_[static_cast<std::size_t>(stage)].group.get() : nullptr;
}

ShardedStage* StageGroups::sharded(int stage) const {
  return ensured(stage) ? stages_[static_cast<std::size_t>(stage)].sharded.get() : nullptr;
}

void StageGroups::destroy(const Alive& alive) {
  for (Stage& s : stages_) {
    drop_group(s, alive);
    if (s.sharded) s.sharded->destroy(engines_, alive);
    s.sharded.reset();
  }
}

}  // namespace weightcast::sync::trainer

#include "launcher/train/rank_weights.h"

#include <algorithm>
#include <cstdint>

namespace weightcast::launcher::train {

std::vector<std::byte> RankWeights::at(int step, std::optional<double>& changed) {
  using sync::trainer::rank_shards;
  const auto k = static_cast<std::uint64_t>(step);
  if (o_.drift != "realistic") return rank_shards(params_, o_.tp, tp_rank_, o_.seed, k, ep_rank_);
  if (!drift_) {
    drifted_ = rank_shards(params_, o_.tp, tp_rank_, o_.seed, 0, ep_rank_);
    const double lr = o_.drift_lr > 0 ? o_.drift_lr : sync::kRealisticLr;
    drift_ = std::make_unique<sync::Drift>(spec_.dtype, drifted_, o_.seed, lr);
  }
  const std::size_t moved = drift_->step(k, drifted_);
  const auto n = static_cast<double>(std::max<std::size_t>(drift_->elements(), 1));
  changed = static_cast<double>(moved) / n;
  return drifted_;
}

}  // namespace weightcast::launcher::train

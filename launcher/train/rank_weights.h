// RankWeights: one weightcast-train rank's shard bytes at each step. --drift jump: the
// generator's step k; --drift realistic: the fp32 masters moved one more optimizer-like step from
// the initial weights (sync/model/drift.h), with the fraction of elements that changed.
// Lifetime: one per rank, borrowing its options and stage parameters. Threading: one thread.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "launcher/train/train_options.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"
#include "sync/trainer/megatron.h"

namespace weightcast::launcher::train {

class RankWeights {
 public:
  RankWeights(const TrainOptions& o, const sync::ModelSpec& spec,
              const std::vector<sync::trainer::MegatronParam>& params, int tp_rank, int ep_rank)
      : o_(o), spec_(spec), params_(params), tp_rank_(tp_rank), ep_rank_(ep_rank) {}

  // This rank's shards at `step`. With realistic drift, `changed` gets the fraction of elements
  // that changed; otherwise it is left alone.
  std::vector<std::byte> at(int step, std::optional<double>& changed);

 private:
  const TrainOptions& o_;
  const sync::ModelSpec& spec_;
  const std::vector<sync::trainer::MegatronParam>& params_;
  const int tp_rank_;
  const int ep_rank_;
  // --drift realistic: this rank's shards as fp32 masters, and their bytes at the last step.
  std::unique_ptr<sync::Drift> drift_;
  std::vector<std::byte> drifted_;
};

}  // namespace weightcast::launcher::train

// LoraWeights: a stage source's adapter under weightcast-train --lora-rank (docs/lora.md):
// lora_A [r, in] and lora_B [out, r], PEFT-named, for every 2-D weight of the stage whose module
// --lora-targets names. Each step regenerates them (the training of an adapter on a frozen base,
// simulated as the base weights' --drift jump is: the generator's step k of each tensor's name),
// so every step's adapter differs from the last in every element.
// The adapter is made whole on the stage source: it is megabytes, and the TP ranks' shards of it
// are not gathered (the base weights' TP gather does not run either).
// Lifetime: one per stage source. Threading: one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "sync/model/lora.h"
#include "sync/trainer/megatron.h"
#include "sync/trainer/tensors.h"

namespace weightcast::launcher::train {

class LoraWeights {
 public:
  // comm::ConfigError when no weight of the stage is targeted.
  LoraWeights(const sync::LoraConfig& config,
              const std::vector<sync::trainer::MegatronParam>& params, std::uint64_t seed,
              int stage);

  // The adapter at `step`; the views stay valid until the next call.
  std::vector<sync::trainer::NamedTensor> at(int step);
  // Its tensors' names, dtypes and shapes (the same every step).
  std::vector<sync::TensorMeta> metas() const;
  std::size_t byte_count() const;

 private:
  std::uint64_t seed_;
  std::vector<sync::trainer::HostTensor> tensors_;
};

}  // namespace weightcast::launcher::train

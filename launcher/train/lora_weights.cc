#include "launcher/train/lora_weights.h"

#include <string>

#include "comm/errors.h"
#include "sync/model/model.h"

namespace weightcast::launcher::train {

using sync::LoraPart;
using sync::trainer::HostTensor;
using sync::trainer::NamedTensor;

LoraWeights::LoraWeights(const sync::LoraConfig& config,
                         const std::vector<sync::trainer::MegatronParam>& params,
                         std::uint64_t seed, int stage)
    : seed_(seed) {
  for (const auto& param : params) {
    for (const auto& part : param.parts) {
      constexpr std::string_view kWeight = ".weight";
      if (part.shape.size() != 2 || !part.name.ends_with(kWeight)) continue;
      const std::string module = part.name.substr(0, part.name.size() - kWeight.size());
      if (!config.targets(module)) continue;
      const std::int64_t out = part.shape[0], in = part.shape[1];
      for (const LoraPart which : {LoraPart::kA, LoraPart::kB}) {
        HostTensor t;
        t.meta.name = sync::lora_tensor_name(module, which);
        t.meta.dtype = part.dtype;
        t.meta.shape = which == LoraPart::kA ? std::vector<std::int64_t>{config.r, in}
                                             : std::vector<std::int64_t>{out, config.r};
        t.bytes.resize(t.meta.byte_count());
        tensors_.push_back(std::move(t));
      }
    }
  }
  if (tensors_.empty()) {
    std::string targets;
    for (const auto& t : config.target_modules) targets += (targets.empty() ? "" : ",") + t;
    throw comm::ConfigError("--lora-targets " + targets + ": no 2-D weight of stage " +
                            std::to_string(stage) + " is one of them");
  }
}

std::vector<NamedTensor> LoraWeights::at(int step) {
  std::vector<NamedTensor> out;
  for (auto& t : tensors_) {
    sync::fill_tensor(t.meta, seed_, static_cast<std::uint64_t>(step), t.bytes);
    out.push_back(t.view());
  }
  return out;
}

std::vector<sync::TensorMeta> LoraWeights::metas() const {
  std::vector<sync::TensorMeta> out;
  for (const auto& t : tensors_) out.push_back(t.meta);
  return out;
}

std::size_t LoraWeights::byte_count() const {
  std::size_t total = 0;
  for (const auto& t : tensors_) total += t.bytes.size();
  return total;
}

}  // namespace weightcast::launcher::train

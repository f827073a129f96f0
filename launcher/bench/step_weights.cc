#include "launcher/bench/step_weights.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace weightcast::launcher {

StepWeights::StepWeights(const std::vector<sync::TensorMeta>& metas, bool realistic, double lr,
                         bool digest_at_write, bool shared)
    : metas_(metas), storage_(metas, sync::kDefaultBucketAlignment, shared) {
  if (digest_at_write) digests_.resize(metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) {
    if (!realistic) continue;
    sync::fill_tensor(metas[i], 1, 0, storage_[i]);
    drifts_.emplace_back(metas[i].dtype, storage_[i], 1, lr);
  }
}

double StepWeights::advance(int step) {
  digest_seconds_ = 0;
  if (drifts_.empty()) {
    for (std::size_t i = 0; i < metas_.size(); ++i) {
      sync::fill_tensor(metas_[i], 1, static_cast<std::uint64_t>(step), storage_[i]);
      digest(i);
    }
    return 1.0;
  }
  std::size_t changed = 0;
  std::size_t total = 0;
  for (std::size_t i = 0; i < drifts_.size(); ++i) {
    changed += drifts_[i].step(static_cast<std::uint64_t>(step), storage_[i]);
    total += drifts_[i].elements();
    digest(i);
  }
  return static_cast<double>(changed) / static_cast<double>(std::max<std::size_t>(total, 1));
}

std::vector<sync::trainer::NamedTensor> StepWeights::views() const {
  std::vector<sync::trainer::NamedTensor> out;
  for (std::size_t i = 0; i < metas_.size(); ++i) {
    out.push_back({metas_[i], storage_[i], digests_.empty() ? nullptr : &digests_[i]});
  }
  return out;
}

void StepWeights::digest(std::size_t i) {
  if (digests_.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  digests_[i] = sync::tensor_digest(storage_[i]);
  digest_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace weightcast::launcher

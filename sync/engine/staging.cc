#include "sync/engine/staging.h"

#include <cstring>

#include "comm/errors.h"

namespace weightcast::sync::engine {

Staging::Staging(int rank_count) : rank_count_(rank_count) {
  WC_ENFORCE_GT(rank_count, 0, "engine rank count");
}

void Staging::stage(Runner runner, int rank, const TensorMeta& meta,
                    std::span<const std::byte> bytes) {
  WC_ENFORCE_GE(rank, 0);
  WC_ENFORCE_LT(rank, rank_count_);
  WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "staged bytes of '", meta.name, "'");
  // Hash and copy outside the lock: ranks and groups stage concurrently.
  const Digest digest = tensor_digest(bytes);
  std::vector<std::byte> copy;
  if (rank == 0) copy.assign(bytes.begin(), bytes.end());

  std::lock_guard lock(mu_);
  if (discarded_) return;
  auto& entry = map_for(runner)[meta.name];
  if (entry.rank_digests.empty()) {
    entry.meta = meta;
    entry.rank_digests.resize(static_cast<std::size_t>(rank_count_));
  }
  entry.rank_digests[static_cast<std::size_t>(rank)] = digest;
  if (rank == 0) {
    staged_bytes_ += copy.size();
    entry.bytes = std::move(copy);
  }
}

void Staging::discard() {
  std::lock_guard lock(mu_);
  discarded_ = true;
  staged_bytes_ = 0;
  target_.clear();
  draft_.clear();
}

bool Staging::discarded() const {
  std::lock_guard lock(mu_);
  return discarded_;
}

std::size_t Staging::tensor_count(Runner runner) const {
  std::lock_guard lock(mu_);
  return map_for(runner).size();
}

std::size_t Staging::staged_bytes() const {
  std::lock_guard lock(mu_);
  return staged_bytes_;
}

std::map<std::string, StagedTensor> Staging::take(Runner runner) {
  std::lock_guard lock(mu_);
  Map out;
  out.swap(map_for(runner));
  return out;
}

}  // namespace weightcast::sync::engine

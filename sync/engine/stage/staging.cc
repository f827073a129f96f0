#include "sync/engine/stage/staging.h"

#include <utility>

#include "comm/errors.h"

namespace weightcast::sync::engine {

const StagedCopy* StagedTensor::copy(const Digest& digest) const {
  for (const StagedCopy& c : copies) {
    if (c.digest == digest) return &c;
  }
  return nullptr;
}

Staging::Staging(int rank_count, bool distinct) : rank_count_(rank_count), distinct_(distinct) {
  WC_ENFORCE_GT(rank_count, 0, "engine rank count");
}

void Staging::stage(Runner runner, int rank, const TensorMeta& meta,
                    std::span<const std::byte> bytes) {
  WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "staged bytes of '", meta.name, "'");
  // Hash and copy outside the lock: ranks and groups stage concurrently.
  const Digest digest = tensor_digest(bytes);
  stage(runner, rank, meta, rank == 0 || distinct_ ? SharedBytes::copy_of(bytes) : SharedBytes(),
        digest);
}

void Staging::stage(Runner runner, int rank, const TensorMeta& meta, SharedBytes bytes,
                    Digest digest) {
  WC_ENFORCE_GE(rank, 0);
  WC_ENFORCE_LT(rank, rank_count_);
  if (rank == 0 || distinct_)
    WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "staged bytes of '", meta.name, "'");
  // `bytes`, a parameter, outlives the lock: a replaced view is released after it, since dropping
  // the last reference to a block takes the pool's lock.
  std::lock_guard lock(mu_);
  if (discarded_) return;
  auto& entry = map_for(runner)[meta.name];
  if (entry.rank_digests.empty()) {
    entry.meta = meta;
    entry.rank_digests.resize(static_cast<std::size_t>(rank_count_));
  }
  entry.rank_digests[static_cast<std::size_t>(rank)] = digest;
  if (distinct_) {
    if (entry.copy(digest) == nullptr) {
      staged_bytes_ += bytes.size();
      entry.copies.push_back({digest, meta, std::exchange(bytes, SharedBytes())});
    }
  } else if (rank == 0) {
    staged_bytes_ += bytes.size();
    staged_bytes_ -= entry.bytes.size();
    std::swap(entry.bytes, bytes);
  }
}

void Staging::discard() {
  Map target, draft;  // their blocks return to the pool after the lock
  std::lock_guard lock(mu_);
  discarded_ = true;
  staged_bytes_ = 0;
  target.swap(target_);
  draft.swap(draft_);
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

std::optional<RankDisagreement> find_rank_disagreement(
    const std::map<Runner, std::map<std::string, StagedTensor>>& staged, std::size_t ranks) {
  for (const auto& [id, tensors] : staged) {
    for (const auto& [name, t] : tensors) {
      const auto& first = t.rank_digests.empty() ? std::nullopt : t.rank_digests[0];
      for (std::size_t r = 0; r < ranks; ++r) {
        const auto& d = r < t.rank_digests.size() ? t.rank_digests[r] : std::nullopt;
        if (!d || !first || *d != *first) return RankDisagreement{r, id, name, !d};
      }
    }
  }
  return std::nullopt;
}

}  // namespace weightcast::sync::engine

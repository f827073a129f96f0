// Staging: what one update session has received so far, per runner, not yet visible to readers.
//
// Rank 0 of the engine keeps each tensor's bytes (they become the runner's tensors at commit):
// on the data path a view of the pool block the bucket was received into, not a copy. Every
// rank, rank 0 included, records the digest of the bytes it received, so commit can check that
// all ranks staged identical data without holding a copy per rank.
// An engine whose ranks keep slices (shard plans, docs/sharding.md) stages with `distinct`: its
// ranks receive different bytes of one tensor, so one copy of each distinct content is kept
// (keyed by digest: ranks that staged equal bytes, e.g. whole tensors, share one copy), and commit
// puts the full tensor together from them (sync/engine/commit/local_ranks.h). A discarded staging
// (abort, failure, timeout) drops its bytes and ignores later writes from buckets still in
// flight, so a stale receive can never leak into the next session.
// Lifetime: one per session, shared (std::shared_ptr) by the session and its in-flight buckets.
// Threading: stage() is called concurrently by the unpack threads of every rank and group; the
// rest is called by the Engine under its lock once no bucket is in flight.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sync/engine/stage/block_pool.h"
#include "sync/model/checksum.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::engine {

// One distinct content staged for a tensor (distinct staging): the first rank's copy of it.
struct StagedCopy {
  Digest digest;
  TensorMeta meta;  // as that rank received it (a slice's shape)
  SharedBytes bytes;
};

struct StagedTensor {
  TensorMeta meta;
  SharedBytes bytes;                                // rank 0's bytes, raw (no layout applied)
  std::vector<std::optional<Digest>> rank_digests;  // index = engine rank
  std::vector<StagedCopy> copies;                   // distinct staging only; `bytes` stays empty

  // The copy with `digest`, or nullptr.
  const StagedCopy* copy(const Digest& digest) const;
};

// The one rule for a commit's staged copies: every engine rank staged each tensor, with the digest
// of the first rank's copy. The first disagreement, by rank index (0: the first staged rank).
struct RankDisagreement {
  std::size_t rank = 0;
  Runner runner = Runner::kTarget;
  std::string tensor;
  bool missing = false;  // the rank did not stage it at all
};
std::optional<RankDisagreement> find_rank_disagreement(
    const std::map<Runner, std::map<std::string, StagedTensor>>& staged, std::size_t ranks);

class Staging {
 public:
  // `distinct`: keep one copy of each distinct content any rank staged (see above), not rank 0's.
  explicit Staging(int rank_count, bool distinct = false);

  // Stages `bytes` (exactly meta.byte_count() long) received by engine rank `rank` for `runner`.
  // Rank 0 keeps a private copy; for tests and callers whose buffer does not outlive the call.
  void stage(Runner runner, int rank, const TensorMeta& meta, std::span<const std::byte> bytes);
  // The data path: `digest` is that of `bytes`, computed by the caller while the bytes are hot;
  // rank 0 keeps `bytes` itself (a view sharing ownership of its block), other ranks drop it
  // (distinct staging: a rank whose digest no kept copy has keeps its bytes, the others drop them).
  void stage(Runner runner, int rank, const TensorMeta& meta, SharedBytes bytes, Digest digest);

  void discard();
  bool discarded() const;

  int rank_count() const { return rank_count_; }
  bool distinct() const { return distinct_; }
  std::size_t tensor_count(Runner runner) const;
  std::size_t staged_bytes() const;

  // Moves the runner's staged tensors out (name -> tensor).
  std::map<std::string, StagedTensor> take(Runner runner);

 private:
  using Map = std::map<std::string, StagedTensor>;
  Map& map_for(Runner runner) { return runner == Runner::kTarget ? target_ : draft_; }
  const Map& map_for(Runner runner) const { return runner == Runner::kTarget ? target_ : draft_; }

  const int rank_count_;
  const bool distinct_;
  mutable std::mutex mu_;
  bool discarded_ = false;
  std::size_t staged_bytes_ = 0;
  Map target_;
  Map draft_;
};

}  // namespace weightcast::sync::engine

#include "sync/engine/commit/slice_assembly.h"

#include <utility>

#include "sync/engine/commit/receiver_loader.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::engine {

namespace {

// One tensor's copies, checked and put together (see the header).
class TensorAssembly {
 public:
  TensorAssembly(Runner runner, const std::string& name, StagedTensor& staged,
                 std::span<const ShardPlan> plans, int first_rank)
      : runner_(runner), name_(name), staged_(staged), plans_(plans), first_rank_(first_rank) {}

  void run(const FullShape& full_shape, BlockPool& pool, bool rehash) {
    TensorMeta full = staged_.meta;
    if (auto shape = full_shape(runner_, name_)) full.shape = std::move(*shape);
    if (rehash) {
      for (const StagedCopy& c : staged_.copies) {
        if (tensor_digest(c.bytes) != c.digest) {
          fail("its staged bytes no longer match their digest at receive", std::nullopt);
        }
      }
    }
    const StagedCopy* whole = nullptr;  // the first copy of the full tensor, if any
    for (const StagedCopy& c : staged_.copies) {
      if (c.meta.shape == full.shape) {
        whole = &c;
        break;
      }
    }
    SharedBytes out;
    if (whole != nullptr) {
      out = whole->bytes;
    } else {
      auto block = pool.acquire(full.byte_count());
      out = SharedBytes(block, std::span<std::byte>(block->data(), full.byte_count()));
    }
    std::vector<std::pair<const TensorSlice*, Digest>> slices;  // distinct slices unpacked
    const auto ranks = plans_.size();
    for (std::size_t r = 0; r < ranks; ++r) {
      const TensorSlice* entry = plans_[r].find(name_);
      const auto& digest = r < staged_.rank_digests.size() ? staged_.rank_digests[r] : std::nullopt;
      if (!digest) {
        if (entry != nullptr && entry->kind == TensorSlice::Kind::kAbsent) continue;
        fail("was not received by this rank", r);
      }
      const StagedCopy* copy = staged_.copy(*digest);
      if (copy == nullptr) fail("has no staged copy", r);  // not reached: staging keeps one
      if (copy->meta.shape == full.shape) {
        if (copy->digest != whole->digest) fail(kDiffers, r);
        continue;
      }
      if (entry == nullptr || entry->kind != TensorSlice::Kind::kSlice ||
          copy->meta.shape != sliced_shape(full, *entry)) {
        fail("staged shape " + shape_text(copy->meta.shape) + ", but its plan keeps " +
                 (entry != nullptr ? describe(*entry) : std::string("all")) + " of " +
                 shape_text(full.shape),
             r);
      }
      if (whole != nullptr) {
        if (slice_digest(full, *entry, whole->bytes) != *digest) fail(kDiffers, r);
        continue;
      }
      bool seen = false;
      for (const auto& [slice, d] : slices) {
        if (*slice != *entry) continue;
        if (d != *digest) fail("differs from another rank's copy of the same slice", r);
        seen = true;
      }
      if (seen) continue;
      unpack_slice(full, *entry, copy->bytes, out.span());
      slices.emplace_back(entry, *digest);
    }
    const Digest digest = whole != nullptr ? whole->digest : tensor_digest(out);
    staged_ = StagedTensor{
        std::move(full), std::move(out), std::vector<std::optional<Digest>>(ranks, digest), {}};
  }

 private:
  static constexpr char kDiffers[] = "differs from another rank's copy";

  [[noreturn]] void fail(const std::string& what, std::optional<std::size_t> rank) const {
    const std::string who =
        rank ? "engine rank " + std::to_string(first_rank_ + static_cast<int>(*rank)) + ": " : "";
    throw ReceiverError(500, who + "runner '" + std::string(to_string(runner_)) + "': tensor '" +
                                 name_ + "' " + what +
                                 "; nothing loaded, weight_version unchanged");
  }

  const Runner runner_;
  const std::string& name_;
  StagedTensor& staged_;
  const std::span<const ShardPlan> plans_;
  const int first_rank_;
};

}  // namespace

void assemble_slices(std::map<Runner, std::map<std::string, StagedTensor>>& staged,
                     std::span<const ShardPlan> plans, const FullShape& full_shape, BlockPool& pool,
                     bool rehash, int first_rank) {
  for (auto& [runner, tensors] : staged) {
    for (auto& [name, t] : tensors) {
      TensorAssembly(runner, name, t, plans, first_rank).run(full_shape, pool, rehash);
    }
  }
}

}  // namespace weightcast::sync::engine

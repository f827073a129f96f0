#include "sync/engine/receive/receive_digests.h"

#include <algorithm>
#include <span>

#include "comm/errors.h"

namespace weightcast::sync::engine {

ReceiveDigests::ReceiveDigests(const BucketPlan& plan, const std::vector<bool>& wanted,
                               const std::byte* buffer)
    : plan_(plan), buffer_(buffer), digests_(plan.entries.size()) {
  WC_ENFORCE_EQ(wanted.size(), plan.entries.size(), "one wanted flag per bucket entry");
  for (std::size_t i = 0; i < plan.entries.size(); ++i) {
    if (wanted[i]) order_.push_back(i);
  }
  const auto& entries = plan.entries;
  std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
    return entries[a].offset < entries[b].offset;
  });
  std::size_t end = 0;
  for (const std::size_t i : order_) {
    const BucketEntry& e = entries[i];
    if (e.offset > plan.total_bytes || e.bytes > plan.total_bytes - e.offset ||
        (e.bytes > 0 && e.offset < end)) {
      usable_ = false;  // out of the bucket or overlapping: the unpack path reports it
      return;
    }
    if (e.bytes > 0) end = e.offset + e.bytes;
  }
}

void ReceiveDigests::received(std::size_t offset, std::size_t bytes) {
  if (!usable_) return;
  // The whole buffer at once: no piece is in the cache any more than the rest. The unpack
  // thread digests it while the next bucket is received.
  if (offset != done_ || (offset == 0 && bytes >= plan_.total_bytes && bytes > 0)) {
    usable_ = false;
    return;
  }
  done_ += bytes;
  advance();
}

void ReceiveDigests::advance() {
  while (next_ < order_.size()) {
    const std::size_t i = order_[next_];
    const BucketEntry& e = plan_.entries[i];
    const std::size_t end = e.offset + e.bytes;
    if (hashed_ == 0 && end <= done_) {
      digests_[i] = tensor_digest({buffer_ + e.offset, e.bytes});
      ++next_;
      continue;
    }
    if (e.offset >= done_) return;  // none of it has landed yet
    const std::size_t from = e.offset + hashed_;
    const std::size_t to = std::min(end, done_);
    hasher_.update(std::span<const std::byte>(buffer_ + from, to - from));
    hashed_ = to - e.offset;
    if (to < end) return;
    digests_[i] = hasher_.digest();
    hasher_.reset();
    hashed_ = 0;
    ++next_;
  }
}

std::vector<std::optional<Digest>> ReceiveDigests::take() {
  if (!usable_) return std::vector<std::optional<Digest>>(plan_.entries.size());
  return std::move(digests_);
}

}  // namespace weightcast::sync::engine

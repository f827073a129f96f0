#include "sync/trainer/tensor_arena.h"

#include <cstring>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

TensorArena::TensorArena(std::span<const TensorMeta> metas, std::size_t alignment, bool shared) {
  // One bucket holding every tensor: the planner's own offsets (and its alignment check).
  const BucketPlan layout = make_bucket(0, {metas.begin(), metas.end()}, alignment);
  bytes_ = layout.total_bytes;
  // Written now (zeroed, padding included), not page by page as the first step's weights land.
  std::byte* base = nullptr;
  if (shared && bytes_ > 0) {
    segment_.emplace(bytes_, "weightcast-arena");
    base = segment_->bytes().data();
    std::memset(base, 0, bytes_);
  } else {
    memory_ = allocate_pack_buffer(bytes_, true);
    base = memory_.get();
  }
  views_.reserve(layout.entries.size());
  for (const BucketEntry& e : layout.entries) views_.emplace_back(base + e.offset, e.bytes);
}

std::span<std::byte> TensorArena::operator[](std::size_t i) const {
  WC_ENFORCE_LT(i, views_.size(), "arena tensor index");
  return views_[i];
}

}  // namespace weightcast::sync::trainer

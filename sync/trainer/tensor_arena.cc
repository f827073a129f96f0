#include "sync/trainer/tensor_arena.h"

#include <algorithm>
#include <cstring>

#include "comm/errors.h"
#include "comm/huge_pages.h"

namespace weightcast::sync::trainer {

TensorArena::TensorArena(std::span<const TensorMeta> metas, std::size_t alignment) {
  WC_ENFORCE(alignment > 0 && (alignment & (alignment - 1)) == 0,
             "arena alignment must be a power of two, got ", alignment);
  std::vector<std::size_t> offsets;
  offsets.reserve(metas.size());
  std::size_t end = 0;
  for (const TensorMeta& meta : metas) {
    const std::size_t bytes = meta.byte_count();
    // The planner's place(): an empty tensor takes no room and no alignment.
    const std::size_t offset = bytes == 0 ? end : (end + alignment - 1) & ~(alignment - 1);
    offsets.push_back(offset);
    end = offset + bytes;
  }
  bytes_ = end;
  const std::size_t mapped = std::max<std::size_t>(bytes_, 1);
  memory_ = PackBuffer(static_cast<std::byte*>(comm::allocate_huge_pages(mapped)), {mapped});
  // Written now, not page by page as the first step's weights land (and zero padding).
  std::memset(memory_.get(), 0, mapped);
  views_.reserve(metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) {
    views_.emplace_back(memory_.get() + offsets[i], metas[i].byte_count());
  }
}

std::span<std::byte> TensorArena::operator[](std::size_t i) const {
  WC_ENFORCE_LT(i, views_.size(), "arena tensor index");
  return views_[i];
}

}  // namespace weightcast::sync::trainer

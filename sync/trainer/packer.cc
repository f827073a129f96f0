#include "sync/trainer/packer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/errors.h"
#include "comm/huge_pages.h"

namespace weightcast::sync::trainer {

// `touch`: write every page now. Populating the page tables is not enough on a virtual machine
// whose host maps a guest page only when it is first written (measured: the first copy into a
// populated 64 MiB buffer 185-240 ms, into a written one 17-27 ms, the next copies 7-11 ms).
PackBuffer allocate_pack_buffer(std::size_t bytes, bool touch) {
  bytes = std::max<std::size_t>(bytes, 1);
  void* p = comm::allocate_huge_pages(bytes);
#ifdef MADV_POPULATE_WRITE
  // Advice only (and only for the anonymous mappings of large buffers): an older kernel faults
  // the pages in as they are first written.
  if (bytes >= comm::kHugePageBytes) madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
  if (touch) std::memset(p, 0, bytes);
  return PackBuffer(static_cast<std::byte*>(p), PackBufferFree{bytes});
}

void PackBufferFree::operator()(std::byte* p) const {
  comm::free_huge_pages(p, std::max<std::size_t>(bytes, 1));
}

PackBuffer PackBuffers::take(std::size_t bytes, std::size_t& capacity) {
  {
    std::lock_guard lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity))
        best = it;
    }
    if (best != free_.end()) {
      auto buffer = std::move(best->buffer);
      capacity = best->capacity;
      free_.erase(best);
      return buffer;
    }
    // None fits: the buckets grew, so the smaller buffers would only sit there.
    free_.clear();
    allocations_ += 1;
  }
  capacity = bytes;
  return allocate_pack_buffer(bytes, false);
}

void PackBuffers::put(PackBuffer buffer, std::size_t capacity) {
  if (!buffer) return;
  std::lock_guard lock(mu_);
  free_.push_back({std::move(buffer), capacity});
}

void PackBuffers::reserve(std::size_t bytes, std::size_t count) {
  if (bytes == 0) return;
  std::size_t have = 0;
  {
    std::lock_guard lock(mu_);
    for (const Free& f : free_) have += f.capacity >= bytes ? 1 : 0;
    if (have >= count) return;
    std::erase_if(free_, [bytes](const Free& f) { return f.capacity < bytes; });
    allocations_ += count - have;
  }
  for (std::size_t i = have; i < count; ++i) put(allocate_pack_buffer(bytes, true), bytes);
}

std::uint64_t PackBuffers::allocations() const {
  std::lock_guard lock(mu_);
  return allocations_;
}

const std::shared_ptr<PackBuffers>& default_pack_buffers() {
  static const auto pool = std::make_shared<PackBuffers>();
  return pool;
}

bool packs_as_is(const BucketPlan& plan) {
  std::size_t non_empty = 0;
  for (const BucketEntry& e : plan.entries) {
    if (e.bytes == 0) continue;
    non_empty += 1;
    if (e.offset != 0 || e.bytes != plan.total_bytes) return false;
  }
  return non_empty == 1;
}

std::optional<std::span<const std::byte>> in_place(const BucketPlan& plan,
                                                   const TensorSource& source) {
  // The bytes between two tensors are lent too: only gaps under a page, so that they lie on the
  // pages of the tensors around them (mapped, the caller's), never on a page of their own.
  constexpr std::size_t kMaxGap = 4096;
  const std::byte* base = nullptr;
  std::size_t end = 0;  // of the previous non-empty tensor, from the bucket's start
  for (const BucketEntry& e : plan.entries) {
    if (e.bytes == 0) continue;
    const auto bytes = source(e);
    if (bytes.size() != e.bytes) return std::nullopt;  // not one span (a slice view): packed
    if (base == nullptr ? e.offset != 0 : e.offset < end || e.offset - end >= kMaxGap) {
      return std::nullopt;
    }
    const auto at = reinterpret_cast<std::uintptr_t>(bytes.data());
    const auto* b = reinterpret_cast<const std::byte*>(at - e.offset);
    if (base == nullptr) {
      base = b;
    } else if (b != base) {
      return std::nullopt;
    }
    end = e.offset + e.bytes;
  }
  if (base == nullptr || end != plan.total_bytes) return std::nullopt;
  return std::span<const std::byte>(base, plan.total_bytes);
}

BucketPacker::BucketPacker(const std::vector<BucketPlan>& plans, TensorSource source,
                           std::size_t buffers, std::shared_ptr<PackBuffers> pool,
                           AfterPack after_pack, TensorWriter write)
    : plans_(plans),
      source_(std::move(source)),
      write_(std::move(write)),
      pool_(pool ? std::move(pool) : default_pack_buffers()),
      after_pack_(std::move(after_pack)) {
  WC_ENFORCE_GE(buffers, std::size_t{1});
  const std::size_t count = std::min(buffers, plans.size());
  // Sized for every bucket that may need packing; taken from the pool by the packer thread when
  // a bucket first does (the source is not called here: its tensors may still be on their way).
  for (const auto& plan : plans) {
    if (!packs_as_is(plan)) buffer_bytes_ = std::max(buffer_bytes_, plan.total_bytes);
  }
  capacities_.assign(count, 0);
  ready_.assign(count, {});
  buffers_.resize(count);
  thread_ = std::thread([this] { run(); });
}

BucketPacker::~BucketPacker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    pool_->put(std::move(buffers_[i]), capacities_[i]);
  }
}

void BucketPacker::run() {
  const std::uint64_t ring = buffers_.size();
  for (std::uint64_t k = 0; k < plans_.size(); ++k) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || k < released_ + ring; });
      if (stop_) return;
    }
    try {
      const BucketPlan& plan = plans_[k];
      std::span<std::byte> out;
      if (const auto bytes = in_place(plan, source_)) {
        // The broadcast root only reads its buffer, so the caller's const bytes are lent as is.
        out = {const_cast<std::byte*>(bytes->data()), bytes->size()};
      } else {
        PackBuffer& buffer = buffers_[k % ring];
        std::size_t& capacity = capacities_[k % ring];
        // buffer_bytes_ covers the buckets that need packing as planned; one that turns out to
        // need it anyway (a slice view alone in its bucket) takes a larger buffer.
        if (!buffer || capacity < plan.total_bytes) {
          if (buffer) pool_->put(std::move(buffer), capacity);
          buffer = pool_->take(std::max(buffer_bytes_, plan.total_bytes), capacity);
        }
        out = {buffer.get(), plan.total_bytes};
        write_ ? pack_with(plan, write_, out) : pack(plan, source_, out);
      }
      if (after_pack_) after_pack_(k, k % ring, out);
      std::lock_guard lock(mu_);
      ready_[k % ring] = out;
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      packed_ = k + 1;
    }
    cv_.notify_all();
  }
}

std::span<std::byte> BucketPacker::acquire(std::uint64_t k, comm::Deadline deadline) {
  std::unique_lock lock(mu_);
  WC_ENFORCE_EQ(k, acquired_, "buckets are acquired in order");
  WC_ENFORCE_LT(k, static_cast<std::uint64_t>(plans_.size()));
  WC_ENFORCE_LT(k - released_, static_cast<std::uint64_t>(buffers_.size()),
                "release a bucket before acquiring more than the ring holds");
  cv_.wait_until(lock, deadline, [&] { return packed_ > k || error_ != nullptr; });
  if (packed_ <= k) {
    if (error_) std::rethrow_exception(error_);
    throw comm::TimeoutError("bucket " + std::to_string(k) + " was not packed in time");
  }
  ++acquired_;
  return ready_[k % buffers_.size()];
}

void BucketPacker::release(std::uint64_t k) {
  {
    std::lock_guard lock(mu_);
    WC_ENFORCE_EQ(k, released_, "buckets are released in order");
    WC_ENFORCE_LT(k, acquired_, "release of a bucket never acquired");
    released_ = k + 1;
  }
  cv_.notify_all();
}

}  // namespace weightcast::sync::trainer

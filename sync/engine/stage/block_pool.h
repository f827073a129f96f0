// BlockPool and SharedBytes: the host memory received weights live in, reused across updates.
//
// An update receives each bucket straight into a pool block; rank 0's staged tensors are views of
// that block (SharedBytes), and at commit they become the runner's tensors without a copy. When
// the last tensor of a block is replaced by a later commit (or its staging is discarded), the
// block returns to the pool, and the next update receives into it again. So the engine neither
// allocates nor first-touches memory on the data path (the first update receives into memory
// reserved at start-up, the second into the block of the initial weights): fresh pages cost
// the kernel a zeroing fault per 4 KiB, which profiled as the largest engine cost.
// Blocks are never value-initialized: every byte a tensor view covers is written by a receive.
// Sizing follows demand: a request takes the smallest free block that fits, and a block much
// larger than the request is split (the rest stays pooled), so one reserved arena serves all the
// buckets of an update. A block given back merges with its free neighbours in its arena, so the
// pool does not fragment when blocks return in another order or size than they were taken (a
// multi-rank engine's other ranks return theirs at once, rank 0's only when a later commit
// replaces the weights in them). When nothing fits, the arenas that are wholly free and too small
// for it are dropped (bucket sizes grew) and a new arena is mapped; arenas partly in use keep
// their free pieces. Arenas are
// anonymous mappings. reserve() maps an arena advised for transparent huge pages and pre-faults
// it ahead of time (at engine start), so not even the first update pays for fresh pages.
// Lifetime: blocks may outlive the pool (their memory is then freed, not pooled).
// Threading: every method is thread-safe; a block's bytes are guarded by whoever holds it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace weightcast::sync::engine {

// One contiguous piece of host memory, page-aligned, part of an arena.
class Block {
 public:
  Block(std::byte* data, std::size_t capacity) : data_(data), capacity_(capacity) {}
  std::byte* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }

 private:
  std::byte* data_;
  std::size_t capacity_;
};

struct BlockPoolStats {
  std::uint64_t allocations = 0;    // arenas mapped from the system
  std::uint64_t reuses = 0;         // requests served by pooled memory
  std::size_t allocated_bytes = 0;  // arena bytes handed out or pooled
  std::size_t free_bytes = 0;       // pooled bytes, ready for reuse
};

class BlockPool {
 public:
  BlockPool();
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes` (contents undefined); it returns to the pool when the last
  // shared_ptr to it goes.
  std::shared_ptr<const Block> acquire(std::size_t bytes);
  // Maps an arena of `bytes`, touches every page, and pools it.
  void reserve(std::size_t bytes);
  BlockPoolStats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The bytes of one tensor together with shared ownership of the memory they live in: a view of a
// pool block, or an adopted vector (initial weights, private copies).
class SharedBytes {
 public:
  SharedBytes() = default;
  SharedBytes(std::shared_ptr<const void> owner, std::span<std::byte> bytes)
      : owner_(std::move(owner)), bytes_(bytes) {}
  static SharedBytes adopt(std::vector<std::byte> bytes);
  static SharedBytes copy_of(std::span<const std::byte> bytes);

  std::byte* data() const { return bytes_.data(); }
  std::size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }
  std::byte* begin() const { return bytes_.data(); }
  std::byte* end() const { return bytes_.data() + bytes_.size(); }
  std::span<std::byte> span() const { return bytes_; }
  operator std::span<const std::byte>() const { return bytes_; }  // NOLINT: a view, implicitly
  std::vector<std::byte> to_vector() const { return {begin(), end()}; }
  friend bool operator==(const SharedBytes& a, const std::vector<std::byte>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // Whether this view shares its memory with another holder.
  const void* owner() const { return owner_.get(); }

 private:
  std::shared_ptr<const void> owner_;
  std::span<std::byte> bytes_;
};

}  // namespace weightcast::sync::engine

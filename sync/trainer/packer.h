// BucketPacker: packs the buckets of a plan, in order, into a small ring of buffers on a
// background thread, so packing bucket k+1 overlaps the broadcast of bucket k.
//
// The consumer (the broadcasting thread) acquire()s bucket k, which waits until it is packed,
// and release()s it once broadcast, which lets the packer reuse that buffer for bucket
// k + buffers. With two buffers this is double buffering: at most one bucket is on the wire while
// the next is being packed. Buffers come from a PackBuffers pool that outlives the packer, so an
// update reuses the previous update's buffers (already faulted in) instead of allocating anew.
// A bucket that needs no packing (one tensor filling it, or tensors already laid out as the
// bucket, see in_place()) is not copied: acquire() returns the caller's own bytes, which the
// broadcast only reads.
// Lifetime: the plans and whatever `source` reads must outlive the packer; the destructor stops
// the thread and joins it. Threading: one consumer thread calls acquire()/release().
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "comm/deadline.h"
#include "sync/model/bucket.h"

namespace weightcast::sync::trainer {

// Host buffers for packed buckets, kept between updates. Never value-initialized: pack() writes
// every byte of a bucket, padding included. Threading: thread-safe.
// Freed with comm::free_huge_pages (buffers come from comm::allocate_huge_pages, faulted in when
// allocated).
struct PackBufferFree {
  std::size_t bytes = 0;
  void operator()(std::byte* p) const;
};
using PackBuffer = std::unique_ptr<std::byte[], PackBufferFree>;

// A huge-page buffer of at least 1 byte, populated; with `touch` also zeroed (every page written,
// which a virtual machine needs before a copy into it runs at full speed).
PackBuffer allocate_pack_buffer(std::size_t bytes, bool touch);

class PackBuffers {
 public:
  // A buffer of at least `bytes`; give it back with put() to have it reused. A new one is faulted
  // in at once, in one call (MADV_POPULATE_WRITE where the kernel has it), not page by page as
  // the first bucket is packed into it: a page fault per 4 KiB costs the first update most of its
  // packing time on a virtual machine.
  PackBuffer take(std::size_t bytes, std::size_t& capacity);
  void put(PackBuffer buffer, std::size_t capacity);
  // Allocates `count` buffers of `bytes` now and writes every page of them, ahead of the first
  // update, unless the pool already holds that many that large.
  void reserve(std::size_t bytes, std::size_t count);
  std::uint64_t allocations() const;

 private:
  struct Free {
    PackBuffer buffer;
    std::size_t capacity = 0;
  };
  mutable std::mutex mu_;
  std::vector<Free> free_;
  std::uint64_t allocations_ = 0;
};

// The process's pool, used when a caller passes none: updaters are short-lived, the process
// (one trainer rank) is not. It holds at most the buffers of the last update (2 buckets).
const std::shared_ptr<PackBuffers>& default_pack_buffers();

// Whether bucket `plan` is one tensor's bytes as they are (no padding, no neighbour).
bool packs_as_is(const BucketPlan& plan);

// The bucket's bytes where `source` already holds them in the bucket's layout: every tensor at
// the same distance from one base as its offset in `plan` (a TensorArena, or one tensor alone),
// so the bucket is those total_bytes from that base and needs no packing. Alignment padding
// between two tensors (under a page) is sent as the caller's memory holds it (an arena's is zero;
// engines never read it). Empty when any tensor lies elsewhere or is not one span of its size (a
// slice view), or the plan does not start at offset 0 and end with its last tensor, or leaves a
// page or more between two tensors.
std::optional<std::span<const std::byte>> in_place(const BucketPlan& plan,
                                                   const TensorSource& source);

class BucketPacker {
 public:
  // Called on the packer thread with each bucket once packed, before acquire() hands it out, with
  // its ring slot (k % buffers): the place for work that must see the packed bytes first (delta
  // encoding, sync/trainer/delta_source.h). An exception it throws stops the packer.
  using AfterPack =
      std::function<void(std::uint64_t k, std::size_t slot, std::span<const std::byte> packed)>;

  // Starts packing plans[0] at once. `buffers` >= 1; they come from `pool` (null: the default).
  // `write` (optional) writes a tensor into its place in a buffer; without it the packer copies
  // what `source` returns. A tensor whose source bytes are not its size (a slice view, empty) is
  // never lent: its bucket is packed.
  BucketPacker(const std::vector<BucketPlan>& plans, TensorSource source, std::size_t buffers = 2,
               std::shared_ptr<PackBuffers> pool = nullptr, AfterPack after_pack = nullptr,
               TensorWriter write = nullptr);
  ~BucketPacker();
  BucketPacker(const BucketPacker&) = delete;
  BucketPacker& operator=(const BucketPacker&) = delete;

  // The packed bytes of bucket `k` (plans[k].total_bytes long). Buckets are acquired in order,
  // each once (EnforceError otherwise). Rethrows the error that stopped the packer; throws
  // comm::TimeoutError when `deadline` passes first.
  std::span<std::byte> acquire(std::uint64_t k, comm::Deadline deadline);

  // Hands the buffer of bucket `k`, the oldest acquired one, back to the packer.
  void release(std::uint64_t k);

 private:
  void run();

  const std::vector<BucketPlan>& plans_;
  TensorSource source_;
  TensorWriter write_;  // may be empty
  std::shared_ptr<PackBuffers> pool_;
  AfterPack after_pack_;
  std::size_t buffer_bytes_ = 0;     // the largest bucket that may need packing
  std::vector<PackBuffer> buffers_;  // per ring slot, taken when first needed (packer thread)
  std::vector<std::size_t> capacities_;
  std::vector<std::span<std::byte>> ready_;  // per ring slot: what acquire() hands out

  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t packed_ = 0;    // buckets [0, packed_) are ready
  std::uint64_t acquired_ = 0;  // buckets [0, acquired_) were handed out
  std::uint64_t released_ = 0;  // buckets [0, released_) gave their buffer back
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace weightcast::sync::trainer

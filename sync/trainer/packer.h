// BucketPacker: packs the buckets of a plan, in order, into a small ring of buffers on a
// background thread, so packing bucket k+1 overlaps the broadcast of bucket k.
//
// The consumer (the broadcasting thread) acquire()s bucket k, which waits until it is packed,
// and release()s it once broadcast, which lets the packer reuse that buffer for bucket
// k + buffers. With two buffers this is double buffering: at most one bucket is on the wire while
// the next is being packed. Buffers are sized to the largest bucket and allocated once.
// Lifetime: the plans and whatever `source` reads must outlive the packer; the destructor stops
// the thread and joins it. Threading: one consumer thread calls acquire()/release().
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm/deadline.h"
#include "sync/bucket.h"

namespace weightcast::sync::trainer {

class BucketPacker {
 public:
  // Starts packing plans[0] at once. `buffers` >= 1.
  BucketPacker(const std::vector<BucketPlan>& plans, TensorSource source, std::size_t buffers = 2);
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
  std::vector<std::unique_ptr<std::byte[]>> buffers_;

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

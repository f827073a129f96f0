// ColocatedSegments: the memory a ColocatedSender (sync/trainer/colocated_sender.h) lays its
// buckets out in (docs/colocated.md). Two sealed memfd segments (double buffering: bucket k into
// slot k % 2), and with ColocateMemory::kCuda two exported device segments beside them (the host
// slot is where a bucket is packed and hashed, the device slot what engines open), plus the
// device segments of failed sends, set aside rather than freed: an engine that did not answer may
// still have one open, and CUDA leaves freeing such an allocation undefined.
// Lifetime: owned by its sender; every segment is freed with it (and by the kernel with the
// process). Threading: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>

#include "comm/colocate/cuda_ipc.h"
#include "comm/colocate/segment.h"

namespace weightcast::sync::trainer {

// Where the colocated buckets lie (UpdaterOptions::colocate_memory, weightcast-train
// --colocate-memory): kHost, sealed memfd segments; kCuda, device segments handed out as CUDA IPC
// handles (needs a CUDA device; comm::ConfigError at the first bucket otherwise).
enum class ColocateMemory { kHost, kCuda };
std::string_view to_string(ColocateMemory memory);
// "host" or "cuda"; comm::ConfigError otherwise.
ColocateMemory parse_colocate_memory(std::string_view text);

class ColocatedSegments {
 public:
  // `device`: kCuda's CUDA device, resolved by the caller (comm::cuda_resolve_device).
  ColocatedSegments(ColocateMemory memory, int device) : memory_(memory), device_(device) {}
  ColocatedSegments(const ColocatedSegments&) = delete;
  ColocatedSegments& operator=(const ColocatedSegments&) = delete;

  ColocateMemory memory() const { return memory_; }
  // Every slot of at least `bytes` (rounded up to 1 MiB), reused when large enough; a slot an
  // allocation left empty half way is allocated again with the others.
  void reserve(std::size_t bytes);
  // Bucket k's slots (reserve() first).
  comm::colocate::SharedSegment& host(std::uint64_t k);
  comm::colocate::CudaIpcSegment& device(std::uint64_t k);  // kCuda only
  // After a failed send (kCuda): the device slots are set aside, fresh ones come with the next
  // reserve(); the oldest set aside are freed once more than kMaxRetired are held.
  void retire_device();

 private:
  static constexpr std::size_t kMaxRetired = 4;

  const ColocateMemory memory_;
  const int device_;
  std::optional<comm::colocate::SharedSegment> host_[2];
  std::unique_ptr<comm::colocate::CudaIpcSegment> device_slots_[2];
  std::deque<std::unique_ptr<comm::colocate::CudaIpcSegment>> retired_;
};

}  // namespace weightcast::sync::trainer

#include "sync/trainer/bucket_broadcast.h"

#include <algorithm>

#include "comm/device_memory.h"

namespace weightcast::sync::trainer {

using comm::seconds_since;

// A device buffer for the NCCL path, freed on scope exit.
struct BucketBroadcaster::DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) : ptr(bytes > 0 ? comm::cuda_alloc(bytes) : nullptr) {}
  ~DeviceBuffer() { comm::cuda_free(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

BucketBroadcaster::BucketBroadcaster(comm::Communicator& comm, comm::MemoryKind memory,
                                     LoadFormat format, double& seconds)
    : comm_(comm), memory_(memory), format_(format), seconds_(seconds) {}

BucketBroadcaster::~BucketBroadcaster() = default;

void BucketBroadcaster::reserve(std::size_t bytes) {
  if (memory_ == comm::MemoryKind::kCuda) device_ = std::make_unique<DeviceBuffer>(bytes);
}

std::byte* BucketBroadcaster::on_device(std::span<std::byte> bytes) {
  if (memory_ != comm::MemoryKind::kCuda) return bytes.data();
  comm::cuda_copy_to_device(device_->ptr, bytes.data(), bytes.size());
  return static_cast<std::byte*>(device_->ptr);
}

void BucketBroadcaster::bucket(const BucketPlan& plan, std::span<std::byte> bytes,
                               comm::Deadline deadline) {
  std::byte* data = on_device(bytes);
  const auto start = comm::Clock::now();
  if (format_ == LoadFormat::kPerTensor) {
    // One collective per tensor, as a torch trainer's dist.broadcast per tensor.
    for (const BucketEntry& entry : plan.entries) {
      broadcast(data + entry.offset, entry.bytes, deadline);
    }
  } else {
    broadcast(data, bytes.size(), deadline);
  }
  seconds_ += seconds_since(start);
}

void BucketBroadcaster::payload(std::span<std::byte> bytes, comm::Deadline deadline) {
  std::byte* data = on_device(bytes);
  const auto start = comm::Clock::now();
  broadcast(data, bytes.size(), deadline);
  seconds_ += seconds_since(start);
}

void BucketBroadcaster::tensors(
    const BucketPlan& plan,
    const std::function<std::span<const std::byte>(const BucketEntry&)>& bytes_of,
    comm::Deadline deadline) {
  const auto start = comm::Clock::now();
  for (const BucketEntry& entry : plan.entries) {
    const auto bytes = bytes_of(entry);
    // The root only reads its buffer.
    broadcast(const_cast<std::byte*>(bytes.data()), bytes.size(), deadline);
  }
  seconds_ += seconds_since(start);
}

void BucketBroadcaster::broadcast(std::byte* data, std::size_t bytes, comm::Deadline deadline) {
  comm::BroadcastOptions opts;
  opts.buffer = data;
  opts.bytes = bytes;
  opts.root = 0;
  opts.timeout = std::max(comm::Millis(1), comm::remaining(deadline));
  opts.memory = memory_;
  try {
    comm_.broadcast(opts);
  } catch (...) {
    failed_ = true;
    throw;
  }
}

}  // namespace weightcast::sync::trainer

// BucketBroadcaster: the data plane of one stage's send (sync/trainer/bucket_sender.h): each
// bucket, delta payload or tensor broadcast from the source (root 0) on the group's communicator,
// in host memory in place or through one device buffer on the NCCL path, each bounded by the data
// phase's deadline. It adds the time spent broadcasting to the result's broadcast_seconds and
// remembers whether a failure came out of a broadcast (rather than the source's own work).
// Lifetime: one per send, borrowing the communicator. Threading: the sender's thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "sync/model/bucket.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::trainer {

class BucketBroadcaster {
 public:
  // `seconds` accumulates the time spent in broadcasts.
  BucketBroadcaster(comm::Communicator& comm, comm::MemoryKind memory, LoadFormat format,
                    double& seconds);
  ~BucketBroadcaster();
  BucketBroadcaster(const BucketBroadcaster&) = delete;
  BucketBroadcaster& operator=(const BucketBroadcaster&) = delete;

  // The NCCL path: the device buffer every bucket is copied into, `bytes` at most.
  void reserve(std::size_t bytes);
  // A packed bucket (kPerTensor: one collective per tensor, as a torch trainer's dist.broadcast).
  void bucket(const BucketPlan& plan, std::span<std::byte> bytes, comm::Deadline deadline);
  // A delta payload: one broadcast of its bytes.
  void payload(std::span<std::byte> bytes, comm::Deadline deadline);
  // Per-tensor format in host memory: each tensor from the caller's bytes, nothing packed.
  void tensors(const BucketPlan& plan,
               const std::function<std::span<const std::byte>(const BucketEntry&)>& bytes_of,
               comm::Deadline deadline);
  // Whether the exception being handled came out of a broadcast.
  bool failed() const { return failed_; }

 private:
  struct DeviceBuffer;
  // Where the communicator reads `bytes`: in place (host), or copied into the device buffer.
  std::byte* on_device(std::span<std::byte> bytes);
  void broadcast(std::byte* data, std::size_t bytes, comm::Deadline deadline);

  comm::Communicator& comm_;
  const comm::MemoryKind memory_;
  const LoadFormat format_;
  double& seconds_;
  std::unique_ptr<DeviceBuffer> device_;
  bool failed_ = false;
};

}  // namespace weightcast::sync::trainer

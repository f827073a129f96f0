// CUDA helpers of the NCCL backend: choosing a usable device, keeping the calling thread's
// current device unchanged across a call, and checking that a broadcast buffer is device memory.
// Private to comm/nccl/ and its tests (it includes the CUDA runtime header, so public headers
// must not include it).
// Threading: free functions are thread-safe; a ScopedDevice belongs to the thread that made it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "comm/communicator.h"
#include "comm/non_copyable.h"

namespace weightcast::comm::nccl_detail {

// "cudaErrorName: description", for messages.
std::string describe_cuda_error(cudaError_t error);

// Resolves `requested` (-1: the calling thread's current device) to an existing device ordinal.
// Throws ConfigError with the CUDA error text when no device is usable or the ordinal does not
// exist, EnforceError for an ordinal below -1.
int resolve_cuda_device(int requested);

// Makes `device` current (creating its context) and restores the previous device on destruction,
// so a caller that drives several GPUs from one thread keeps its own choice. Throws ConfigError
// when the device cannot be made current.
class ScopedDevice : comm::NonCopyable {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();

 private:
  int previous_ = -1;
  int device_ = -1;
};

// Throws EnforceError unless `opts` names CUDA memory that `device` can use: memory kind kCuda,
// and (for a non-empty buffer) a pointer that CUDA reports as device memory of `device` or as
// managed memory. Host memory, even pinned, is refused: NCCL would read it through the wrong path.
void check_device_buffer(const BroadcastOptions& opts, int device);

}  // namespace weightcast::comm::nccl_detail

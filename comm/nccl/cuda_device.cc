#include "comm/nccl/cuda_device.h"

#include "comm/errors.h"

namespace weightcast::comm::nccl_detail {

std::string describe_cuda_error(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

namespace {
// Non-sticky CUDA errors linger in the thread's last-error slot; clear them so a later, unrelated
// cudaGetLastError() does not report ours.
std::string take_cuda_error(cudaError_t error) {
  (void)cudaGetLastError();
  return describe_cuda_error(error);
}
}  // namespace

int resolve_cuda_device(int requested) {
  WC_ENFORCE_GE(requested, -1, "cuda_device must be an ordinal or -1 (current device)");
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    // No device at all is a plain configuration fact; any other error means a GPU may be there
    // but the driver or runtime is broken, which must not read as "no GPU".
    if (error == cudaErrorNoDevice) {
      take_cuda_error(error);
      throw ConfigError("nccl backend: no CUDA device is visible");
    }
    throw ConfigError("nccl backend: CUDA runtime error while counting devices (" +
                      take_cuda_error(error) + ")");
  }
  if (count <= 0) throw ConfigError("nccl backend: no CUDA device is visible");
  int device = requested;
  if (device < 0) {
    if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
      throw ConfigError("nccl backend: cannot read the current CUDA device (" +
                        take_cuda_error(error) + ")");
    }
  }
  if (device >= count) {
    throw ConfigError(detail::concat("nccl backend: cuda_device ", device, " does not exist (",
                                     count, " CUDA device(s) visible)"));
  }
  return device;
}

ScopedDevice::ScopedDevice(int device) : device_(device) {
  if (const cudaError_t error = cudaGetDevice(&previous_); error != cudaSuccess) {
    throw ConfigError("nccl backend: cannot read the current CUDA device (" +
                      take_cuda_error(error) + ")");
  }
  if (previous_ == device_) return;
  if (const cudaError_t error = cudaSetDevice(device_); error != cudaSuccess) {
    throw ConfigError(detail::concat("nccl backend: cannot use CUDA device ", device_, " (",
                                     take_cuda_error(error), ")"));
  }
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
}

void check_device_buffer(const BroadcastOptions& opts, int device) {
  WC_ENFORCE(opts.memory == MemoryKind::kCuda,
             "the nccl backend broadcasts CUDA device memory only, got memory kind ",
             to_string(opts.memory));
  if (opts.bytes == 0) return;
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, opts.buffer);
  const std::string why = error == cudaSuccess ? std::string() : take_cuda_error(error);
  WC_ENFORCE(error == cudaSuccess, "cannot inspect broadcast buffer ", opts.buffer, " (", why, ")");
  WC_ENFORCE(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
             "broadcast buffer ", opts.buffer,
             " is not CUDA device or managed memory (cudaMemoryType ",
             static_cast<int>(attributes.type), ")");
  if (attributes.type == cudaMemoryTypeDevice) {
    WC_ENFORCE_EQ(attributes.device, device,
                  "broadcast buffer lives on another CUDA device than the communicator");
  }
}

}  // namespace weightcast::comm::nccl_detail

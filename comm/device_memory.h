// Device memory helpers for tools and tests that move CUDA buffers (the NCCL backend's callers).
// Built against the CUDA runtime when weightcast has NCCL; otherwise every call but
// cuda_device_count() throws ConfigError. Threading: as the CUDA runtime.
#pragma once

#include <cstddef>
#include <string>

namespace weightcast::comm {

// Number of usable CUDA devices (0 without CUDA or without a device); `why` gets the reason
// when it is 0.
int cuda_device_count(std::string* why = nullptr);

// Makes `device` the calling thread's current device (where cuda_alloc allocates). ConfigError,
// with the CUDA error text, when it does not exist or cannot be used.
void cuda_set_device(int device);
// `device` when >= 0, else the calling thread's current device; ConfigError when that is not a
// device of this machine (or there is none).
int cuda_resolve_device(int device);

// Makes `device` the calling thread's current device for its lifetime and then restores the one
// that was current, so work done for weightcast on a caller's thread (a Python engine rank, a
// torch trainer) leaves that thread's CUDA state as it was. ConfigError as cuda_set_device.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device);
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = -1;
};

void* cuda_alloc(std::size_t bytes);  // ConfigError on failure
void cuda_free(void* ptr) noexcept;
void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes);
void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes);

}  // namespace weightcast::comm

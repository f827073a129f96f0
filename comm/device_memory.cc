#include "comm/device_memory.h"

#include <string>

#include "comm/errors.h"
#include "weightcast/config.h"

#if WEIGHTCAST_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace weightcast::comm {

#if WEIGHTCAST_HAVE_NCCL

namespace {
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the caller's next, unrelated check
    throw ConfigError(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
}
}  // namespace

int cuda_resolve_device(int device) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw ConfigError("no CUDA device (" + why + ")");
  if (device < 0) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= count) {
    throw ConfigError("CUDA device " + std::to_string(device) +
                      " does not exist (this machine has " + std::to_string(count) + ")");
  }
  return device;
}

CudaDeviceScope::CudaDeviceScope(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ == device) return;
  cuda_set_device(device);
}

CudaDeviceScope::~CudaDeviceScope() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  (void)cudaGetLastError();
}

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

void cuda_set_device(int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw ConfigError("CUDA device " + std::to_string(device) + ": " + cudaGetErrorString(err));
  }
}

void* cuda_alloc(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}

void cuda_free(void* ptr) noexcept {
  if (ptr) cudaFree(ptr);
}

void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

#else

namespace {
[[noreturn]] void no_cuda() {
  throw ConfigError("this weightcast was built without CUDA/NCCL (WEIGHTCAST_WITH_NCCL)");
}
}  // namespace

int cuda_device_count(std::string* why) {
  if (why) *why = "built without CUDA/NCCL";
  return 0;
}
void cuda_set_device(int) {
  no_cuda();
}
int cuda_resolve_device(int) {
  no_cuda();
}
CudaDeviceScope::CudaDeviceScope(int) {
  no_cuda();
}
CudaDeviceScope::~CudaDeviceScope() = default;
void* cuda_alloc(std::size_t) {
  no_cuda();
}
void cuda_free(void*) noexcept {}
void cuda_copy_to_device(void*, const void*, std::size_t) {
  no_cuda();
}
void cuda_copy_to_host(void*, const void*, std::size_t) {
  no_cuda();
}

#endif

}  // namespace weightcast::comm

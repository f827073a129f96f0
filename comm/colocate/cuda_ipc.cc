#include "comm/colocate/cuda_ipc.h"

#include <cstring>
#include <string>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "comm/hex.h"
#include "weightcast/config.h"

#if WEIGHTCAST_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace weightcast::comm::colocate {
namespace {

#if WEIGHTCAST_HAVE_NCCL
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw ConfigError(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err));
  }
}
static_assert(sizeof(cudaIpcMemHandle_t) == CudaIpcHandle::kBytes);
#else
[[noreturn]] void no_cuda() {
  throw ConfigError("CUDA IPC: this weightcast was built without CUDA (WEIGHTCAST_WITH_NCCL)");
}
#endif

}  // namespace

std::string CudaIpcHandle::to_hex() const {
  return comm::to_hex(bytes);
}

CudaIpcHandle CudaIpcHandle::from_hex(std::string_view hex, std::string_view field) {
  CudaIpcHandle out;
  if (!comm::from_hex(hex, out.bytes)) {
    throw BadRequestError(std::string(field) + ": a CUDA IPC handle is " +
                          std::to_string(2 * kBytes) + " hex digits (got '" +
                          std::string(hex.substr(0, 16)) + (hex.size() > 16 ? "...'" : "'") + ", " +
                          std::to_string(hex.size()) + " characters)");
  }
  return out;
}

void CudaIpcMapping::check_range(std::size_t offset, std::size_t bytes) const {
  WC_ENFORCE(offset <= size_ && bytes <= size_ - offset, "CUDA IPC copy of bytes ", offset, "..",
             offset + bytes, " outside the exported buffer of ", size_, " bytes");
}

void CudaIpcSegment::check_range(std::size_t offset, std::size_t bytes) const {
  WC_ENFORCE(offset <= size_ && bytes <= size_ - offset, "write of bytes ", offset, "..",
             offset + bytes, " outside the CUDA IPC segment of ", size_, " bytes");
}

CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& other) noexcept
    : base_(other.base_), size_(other.size_) {
  other.base_ = nullptr;
  other.size_ = 0;
}

CudaIpcSegment::CudaIpcSegment(std::size_t size) : size_(size) {
  base_ = cuda_alloc(size);
  try {
    handle_ = cuda_ipc_export(base_);
  } catch (...) {
    cuda_free(base_);
    throw;
  }
}

CudaIpcSegment::~CudaIpcSegment() {
  cuda_free(base_);
}

#if WEIGHTCAST_HAVE_NCCL

void CudaIpcSegment::write(std::size_t offset, const void* src, std::size_t bytes) {
  check_range(offset, bytes);
  check_cuda(
      cudaMemcpy(static_cast<std::byte*>(base_) + offset, src, bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy to the CUDA IPC segment");
  // From pageable memory cudaMemcpy may return before the bytes reach the device; another process
  // reads them next, so wait for the device.
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after writing the segment");
}

CudaIpcHandle cuda_ipc_export(const void* device_ptr) {
  cudaIpcMemHandle_t handle;
  check_cuda(cudaIpcGetMemHandle(&handle, const_cast<void*>(device_ptr)), "cudaIpcGetMemHandle");
  CudaIpcHandle out;
  std::memcpy(out.bytes.data(), &handle, CudaIpcHandle::kBytes);
  return out;
}

CudaIpcMapping::CudaIpcMapping(const CudaIpcHandle& handle, std::size_t size) : size_(size) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), CudaIpcHandle::kBytes);
  check_cuda(cudaIpcOpenMemHandle(&base_, h, cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle");
}

CudaIpcMapping::~CudaIpcMapping() {
  if (base_ != nullptr) cudaIpcCloseMemHandle(base_);
}

void CudaIpcMapping::copy_to_device(void* dst, std::size_t offset, std::size_t bytes) const {
  check_range(offset, bytes);
  check_cuda(cudaMemcpy(dst, static_cast<const std::byte*>(base_) + offset, bytes,
                        cudaMemcpyDeviceToDevice),
             "cudaMemcpy from the CUDA IPC mapping");
}

void CudaIpcMapping::copy_to_host(void* dst, std::size_t offset, std::size_t bytes) const {
  check_range(offset, bytes);
  check_cuda(
      cudaMemcpy(dst, static_cast<const std::byte*>(base_) + offset, bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy from the CUDA IPC mapping");
}

#else

void CudaIpcSegment::write(std::size_t, const void*, std::size_t) {
  no_cuda();
}
CudaIpcHandle cuda_ipc_export(const void*) {
  no_cuda();
}
CudaIpcMapping::CudaIpcMapping(const CudaIpcHandle&, std::size_t) {
  no_cuda();
}
CudaIpcMapping::~CudaIpcMapping() = default;
void CudaIpcMapping::copy_to_device(void*, std::size_t, std::size_t) const {
  no_cuda();
}
void CudaIpcMapping::copy_to_host(void*, std::size_t, std::size_t) const {
  no_cuda();
}

#endif

}  // namespace weightcast::comm::colocate

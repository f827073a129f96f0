#include "comm/colocate/cuda_ipc.h"

#include <cstring>
#include <string>

#include "comm/errors.h"
#include "weightcast/config.h"

#if WEIGHTCAST_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace weightcast::comm::colocate {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

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
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * kBytes);
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

CudaIpcHandle CudaIpcHandle::from_hex(std::string_view hex, std::string_view field) {
  if (hex.size() != 2 * kBytes) {
    throw BadRequestError(std::string(field) + ": a CUDA IPC handle is " +
                          std::to_string(2 * kBytes) + " hex digits (got " +
                          std::to_string(hex.size()) + " characters)");
  }
  CudaIpcHandle out;
  for (std::size_t i = 0; i < kBytes; ++i) {
    const int hi = hex_value(hex[2 * i]);
    const int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      throw BadRequestError(std::string(field) + ": not a hex digit at " + std::to_string(2 * i));
    }
    out.bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return out;
}

void CudaIpcMapping::check_range(std::size_t offset, std::size_t bytes) const {
  WC_ENFORCE(offset <= size_ && bytes <= size_ - offset, "CUDA IPC copy of bytes ", offset, "..",
             offset + bytes, " outside the exported buffer of ", size_, " bytes");
}

CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& other) noexcept
    : base_(other.base_), size_(other.size_) {
  other.base_ = nullptr;
  other.size_ = 0;
}

#if WEIGHTCAST_HAVE_NCCL

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

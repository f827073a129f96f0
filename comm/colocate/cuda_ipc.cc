#include "comm/colocate/cuda_ipc.h"

#include <cstring>
#include <string>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "comm/hex.h"
#include "weightcast/config.h"

#if WEIGHTCAST_HAVE_NCCL
#include <cuda.h>  // the driver API's types only: its entry point comes through the runtime
#include <cuda_runtime_api.h>
#endif

namespace weightcast::comm::colocate {
namespace {

#if WEIGHTCAST_HAVE_NCCL
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the caller's next, unrelated check
    throw ConfigError(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err));
  }
}
static_assert(sizeof(cudaIpcMemHandle_t) == CudaIpcHandle::kBytes);

// One copy on `device`'s `stream` (the object's own), returning once it is complete.
void copy_and_wait(int device, void* stream, void* dst, const void* src, std::size_t bytes,
                   cudaMemcpyKind kind) {
  const CudaDeviceScope on(device);
  const auto s = static_cast<cudaStream_t>(stream);
  check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync (CUDA IPC)");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after the copy (CUDA IPC)");
}

void* new_stream() {
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}

// The bytes of the allocation that starts at `base`, from the driver (cuMemGetAddressRange,
// looked up through the runtime, so nothing links libcuda).
std::size_t allocation_bytes(void* base) {
  using GetRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  static const GetRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw ConfigError("the CUDA driver has no cuMemGetAddressRange");
    }
    return reinterpret_cast<GetRange>(fn);
  }();
  CUdeviceptr start = 0;
  std::size_t bytes = 0;
  if (get_range(&start, &bytes, reinterpret_cast<CUdeviceptr>(base)) != CUDA_SUCCESS) {
    throw ConfigError("cuMemGetAddressRange refused the opened CUDA IPC mapping");
  }
  return bytes - static_cast<std::size_t>(reinterpret_cast<CUdeviceptr>(base) - start);
}
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

CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& other) noexcept
    : base_(other.base_), stream_(other.stream_), size_(other.size_), device_(other.device_) {
  other.base_ = nullptr;
  other.stream_ = nullptr;
  other.size_ = 0;
}

CudaIpcMapping::~CudaIpcMapping() {
  close();
}

void CudaIpcMapping::copy_to_device(void* dst, std::size_t offset, std::size_t bytes) const {
  copy(dst, offset, bytes, false);
}

void CudaIpcMapping::copy_to_host(void* dst, std::size_t offset, std::size_t bytes) const {
  copy(dst, offset, bytes, true);
}

#if WEIGHTCAST_HAVE_NCCL

CudaIpcHandle cuda_ipc_export(const void* device_ptr) {
  cudaIpcMemHandle_t handle;
  check_cuda(cudaIpcGetMemHandle(&handle, const_cast<void*>(device_ptr)), "cudaIpcGetMemHandle");
  CudaIpcHandle out;
  std::memcpy(out.bytes.data(), &handle, CudaIpcHandle::kBytes);
  return out;
}

CudaIpcSegment::CudaIpcSegment(std::size_t size, int device)
    : size_(size), device_(cuda_resolve_device(device)) {
  const CudaDeviceScope on(device_);
  try {
    stream_ = new_stream();
    check_cuda(cudaMalloc(&base_, size == 0 ? 1 : size), "cudaMalloc");
    handle_ = cuda_ipc_export(base_);
  } catch (...) {
    if (base_ != nullptr) cudaFree(base_);
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    (void)cudaGetLastError();
    throw;
  }
}

CudaIpcSegment::~CudaIpcSegment() {
  try {
    const CudaDeviceScope on(device_);
    cudaFree(base_);
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    (void)cudaGetLastError();
  } catch (...) {  // the device cannot be made current: nothing else to free it with
  }
}

void CudaIpcSegment::write(std::size_t offset, const void* src, std::size_t bytes) {
  WC_ENFORCE(offset <= size_ && bytes <= size_ - offset, "write of bytes ", offset, "..",
             offset + bytes, " outside the CUDA IPC segment of ", size_, " bytes");
  // Another process reads the bytes next: copy_and_wait returns once they are on the device.
  copy_and_wait(device_, stream_, static_cast<std::byte*>(base_) + offset, src, bytes,
                cudaMemcpyHostToDevice);
}

CudaIpcMapping::CudaIpcMapping(const CudaIpcHandle& handle, std::size_t size, int device)
    : size_(size), device_(cuda_resolve_device(device)) {
  const CudaDeviceScope on(device_);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), CudaIpcHandle::kBytes);
  check_cuda(cudaIpcOpenMemHandle(&base_, h, cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle");
  try {
    stream_ = new_stream();
    // A copy past the exported allocation must never reach the copy engine (it could fault the
    // whole context): the announced size is checked against the driver's.
    if (const std::size_t held = allocation_bytes(base_); held < size_) {
      throw BadRequestError("segment.size: " + std::to_string(size_) +
                            " bytes announced, the exported allocation holds " +
                            std::to_string(held));
    }
  } catch (...) {
    close();
    throw;
  }
}

void CudaIpcMapping::close() noexcept {
  if (base_ == nullptr && stream_ == nullptr) return;
  try {
    const CudaDeviceScope on(device_);
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    if (base_ != nullptr) cudaIpcCloseMemHandle(base_);
    (void)cudaGetLastError();
  } catch (...) {  // the device cannot be made current: nothing else to close it with
  }
  base_ = stream_ = nullptr;
}

void CudaIpcMapping::copy(void* dst, std::size_t offset, std::size_t bytes, bool to_host) const {
  WC_ENFORCE(offset <= size_ && bytes <= size_ - offset, "CUDA IPC copy of bytes ", offset, "..",
             offset + bytes, " outside the exported buffer of ", size_, " bytes");
  copy_and_wait(device_, stream_, dst, static_cast<const std::byte*>(base_) + offset, bytes,
                to_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
}

#else

CudaIpcHandle cuda_ipc_export(const void*) {
  no_cuda();
}
CudaIpcSegment::CudaIpcSegment(std::size_t, int) {
  no_cuda();
}
CudaIpcSegment::~CudaIpcSegment() = default;
void CudaIpcSegment::write(std::size_t, const void*, std::size_t) {
  no_cuda();
}
CudaIpcMapping::CudaIpcMapping(const CudaIpcHandle&, std::size_t, int) {
  no_cuda();
}
void CudaIpcMapping::close() noexcept {}
void CudaIpcMapping::copy(void*, std::size_t, std::size_t, bool) const {
  no_cuda();
}

#endif

}  // namespace weightcast::comm::colocate

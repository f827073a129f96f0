// CUDA IPC for the colocated path on GPUs (docs/colocated.md, "On GPUs"): a trainer process exports
// a device buffer as a CUDA IPC memory handle (64 opaque bytes, carried as 128 hex digits), and an
// engine process on the same host opens it, copies the byte range it needs into memory of its own
// (device or host), and closes it before answering, so the trainer may reuse its buffer, as with a
// memfd segment.
//
// Built against the CUDA runtime when weightcast has CUDA (WEIGHTCAST_WITH_NCCL); without it every
// call but the hex codec throws ConfigError. The handle itself carries no permission: only a
// process of the same user on the same host can open it, and weightcast hands it out only inside
// an owned session (as the segment handle). A process cannot open a handle it exported itself
// (CUDA refuses it); tests export and open in two processes.
// Lifetime/threading: CudaIpcMapping is move-only and closes the mapping on destruction; it uses
// the calling thread's current device.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "comm/non_copyable.h"

namespace weightcast::comm::colocate {

struct CudaIpcHandle {
  static constexpr std::size_t kBytes = 64;  // sizeof(cudaIpcMemHandle_t)
  std::array<unsigned char, kBytes> bytes{};

  std::string to_hex() const;
  // BadRequestError naming `field` unless `hex` is exactly 128 hex digits.
  static CudaIpcHandle from_hex(std::string_view hex, std::string_view field = "handle");
};

// The handle of the device allocation that starts at `device_ptr` (cudaMalloc'd; an interior
// pointer is refused by CUDA). ConfigError with CUDA's error text.
CudaIpcHandle cuda_ipc_export(const void* device_ptr);

// The trainer's end on GPUs: one device allocation of `size` bytes on the calling thread's
// current device, written from host memory and exported once as a handle (the GPU form of a
// SharedSegment). ConfigError with CUDA's error text when CUDA cannot allocate or export.
class CudaIpcSegment : NonCopyable {
 public:
  explicit CudaIpcSegment(std::size_t size);
  ~CudaIpcSegment();

  std::size_t size() const { return size_; }
  const CudaIpcHandle& handle() const { return handle_; }
  // Copies `bytes` host bytes at `src` to [offset, offset + bytes) of the segment and waits until
  // they are on the device, so another process may read them. EnforceError for a range outside
  // the segment.
  void write(std::size_t offset, const void* src, std::size_t bytes);

 private:
  void check_range(std::size_t offset, std::size_t bytes) const;

  void* base_ = nullptr;
  std::size_t size_ = 0;
  CudaIpcHandle handle_;
};

class CudaIpcMapping : NonCopyable {
 public:
  // Opens `handle` on the calling thread's current device; `size` is the announced size of the
  // exported allocation, used to bound every copy. ConfigError when CUDA refuses the handle.
  CudaIpcMapping(const CudaIpcHandle& handle, std::size_t size);
  CudaIpcMapping(CudaIpcMapping&& other) noexcept;
  CudaIpcMapping& operator=(CudaIpcMapping&&) = delete;
  ~CudaIpcMapping();

  std::size_t size() const { return size_; }
  // Copies [offset, offset + bytes) of the exported buffer into device memory `dst` or host
  // memory `dst` (synchronous). EnforceError for a range outside the buffer.
  void copy_to_device(void* dst, std::size_t offset, std::size_t bytes) const;
  void copy_to_host(void* dst, std::size_t offset, std::size_t bytes) const;

 private:
  void check_range(std::size_t offset, std::size_t bytes) const;

  void* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace weightcast::comm::colocate

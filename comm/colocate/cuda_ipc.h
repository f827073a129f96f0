// CUDA IPC for the colocated path on GPUs (docs/colocated.md, "On GPUs"): a trainer process lays a
// bucket out in a device segment it exports as a CUDA IPC memory handle (64 opaque bytes, carried
// as 128 hex digits), and an engine process on the same host opens it, copies the byte range it
// needs into memory of its own (device or host), and closes it before answering, so the trainer
// may reuse its buffer, as with a memfd segment.
//
// Built against the CUDA runtime when weightcast has CUDA (WEIGHTCAST_WITH_NCCL); without it every
// call but the hex codec throws ConfigError. The handle itself carries no permission: weightcast
// hands it out only inside an owned session (as the segment handle). A process cannot open a
// handle it exported itself (CUDA refuses it); tests export and open in two processes.
// Every CUDA call runs on the object's own device (CudaDeviceScope: the calling thread's current
// device is restored after it) and its own non-blocking stream (nothing waits for, or is waited
// for by, work a caller queued on the same device); a failed call leaves no error behind in the
// thread's CUDA state.
// Lifetime/threading: both classes are move-only or fixed, free what they hold on destruction,
// and are used by one thread at a time.
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

// The trainer's end on GPUs: one device allocation of `size` bytes on `device` (-1: the calling
// thread's current one), written from host memory and exported once as a handle (the GPU form of
// a SharedSegment). ConfigError with CUDA's error text when CUDA cannot allocate or export.
class CudaIpcSegment : NonCopyable {
 public:
  explicit CudaIpcSegment(std::size_t size, int device = -1);
  ~CudaIpcSegment();

  std::size_t size() const { return size_; }
  int device() const { return device_; }
  const CudaIpcHandle& handle() const { return handle_; }
  // Copies `bytes` host bytes at `src` to [offset, offset + bytes) of the segment and returns once
  // they are on the device, so another process may read them. EnforceError for a range outside
  // the segment.
  void write(std::size_t offset, const void* src, std::size_t bytes);

 private:
  void* base_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  std::size_t size_ = 0;
  int device_ = -1;
  CudaIpcHandle handle_;
};

class CudaIpcMapping : NonCopyable {
 public:
  // Opens `handle` on `device` (-1: the calling thread's current one); `size` is the announced
  // size of the exported allocation, used to bound every copy. ConfigError when CUDA refuses the
  // handle; BadRequestError when the exported allocation is smaller than `size`.
  CudaIpcMapping(const CudaIpcHandle& handle, std::size_t size, int device = -1);
  CudaIpcMapping(CudaIpcMapping&& other) noexcept;
  CudaIpcMapping& operator=(CudaIpcMapping&&) = delete;
  ~CudaIpcMapping();

  std::size_t size() const { return size_; }
  // Copies [offset, offset + bytes) of the exported buffer into device memory `dst` (of this
  // mapping's device) or host memory `dst`, and returns once it is there. EnforceError for a
  // range outside the buffer.
  void copy_to_device(void* dst, std::size_t offset, std::size_t bytes) const;
  void copy_to_host(void* dst, std::size_t offset, std::size_t bytes) const;

 private:
  void copy(void* dst, std::size_t offset, std::size_t bytes, bool to_host) const;
  void close() noexcept;

  void* base_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  std::size_t size_ = 0;
  int device_ = -1;
};

}  // namespace weightcast::comm::colocate

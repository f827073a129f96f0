// Helpers shared by the NCCL tests: how many CUDA devices this machine offers (and why not, when
// none), device buffers with host round trips, and ranks run as threads.
// Threading: DeviceBuffer belongs to one thread; run_ranks joins every thread before returning.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace weightcast::comm::nccl_testing {

struct CudaDevices {
  int count = 0;
  // Why count is 0: "" when the runtime reports no device (cudaErrorNoDevice or a count of 0),
  // else the CUDA runtime error that stopped it from counting (a broken driver or runtime is
  // not the same as "no GPU", and is reported as what it is).
  std::string error;
};

inline CudaDevices cuda_devices() {
  CudaDevices out;
  const cudaError_t error = cudaGetDeviceCount(&out.count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    out.count = 0;
    if (error != cudaErrorNoDevice) {
      out.error = "CUDA runtime error " + std::string(cudaGetErrorName(error)) + ": " +
                  cudaGetErrorString(error);
    }
  }
  return out;
}

// WEIGHTCAST_REQUIRE_CUDA_DEVICES=N (scripts/gpu-check.sh sets it to the GPUs nvidia-smi lists):
// a device test that needs at most N devices must run, so a missing device or a runtime error is
// a failure, not a skip. Unset or 0: tests skip with the reason.
inline int required_cuda_devices() {
  const char* v = std::getenv("WEIGHTCAST_REQUIRE_CUDA_DEVICES");
  return v == nullptr ? 0 : std::atoi(v);
}

// "" when `needed` devices exist, else the reason a device test must skip. NCCL cannot put two
// ranks of one communicator on the same GPU, so a test of N ranks needs N devices. Throws (a test
// failure) instead when WEIGHTCAST_REQUIRE_CUDA_DEVICES promises at least `needed` devices.
inline std::string cuda_skip_reason(int needed) {
  const CudaDevices devices = cuda_devices();
  if (devices.count >= needed) return "";
  std::string out = "needs " + std::to_string(needed) + " CUDA device(s), found " +
                    std::to_string(devices.count) + ": ";
  if (devices.count == 0) {
    out += devices.error.empty() ? std::string("no CUDA device is visible") : devices.error;
  } else {
    out += "NCCL cannot put two ranks of one communicator on the same GPU";
  }
  if (const int required = required_cuda_devices(); required >= needed) {
    throw std::runtime_error("WEIGHTCAST_REQUIRE_CUDA_DEVICES=" + std::to_string(required) +
                             " but this test " + out);
  }
  return out;
}

// A device allocation on `device`, freed on destruction. Throws std::runtime_error on CUDA errors.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    if (bytes_ > 0) check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      (void)cudaSetDevice(device_);
      (void)cudaFree(ptr_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }

  void upload(const std::vector<std::uint8_t>& host) {
    if (bytes_ == 0) return;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> host(bytes_);
    if (bytes_ == 0) return host;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  static void check(cudaError_t error, const char* what) {
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
    }
  }

  int device_;
  std::size_t bytes_;
  void* ptr_ = nullptr;
};

// Bytes that differ per (seed, index), so a shifted or truncated copy cannot match.
inline std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint8_t> out(bytes);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::uint8_t>(x);
  }
  return out;
}

// Runs fn(rank) on `ranks` threads and returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_ranks(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace weightcast::comm::nccl_testing

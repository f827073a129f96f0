// comm/colocate/cuda_ipc.h: the handle's hex form (anywhere), and a device segment written and
// exported by one process and read by another on the same GPU (skips with the reason without a CUDA
// device; scripts/gpu-check.sh runs it with WEIGHTCAST_REQUIRE_CUDA_DEVICES, where a skip is a
// failure).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/colocate/cuda_ipc.h"
#include "comm/errors.h"
#include "tests/comm/nccl/nccl_test_util.h"

namespace weightcast::comm::colocate {
namespace {

using nccl_testing::DeviceBuffer;
using nccl_testing::pattern;

constexpr std::size_t kBytes = (4 << 20) + 123;
constexpr std::uint32_t kSeed = 17;

TEST(NcclColocateCudaIpc, HandleHexRoundTrips) {
  CudaIpcHandle h;
  for (std::size_t i = 0; i < CudaIpcHandle::kBytes; ++i)
    h.bytes[i] = static_cast<unsigned char>(i * 37);
  const std::string hex = h.to_hex();
  EXPECT_EQ(hex.size(), 2 * CudaIpcHandle::kBytes);
  EXPECT_EQ(CudaIpcHandle::from_hex(hex).bytes, h.bytes);
}

TEST(NcclColocateCudaIpc, BadHexIsABadRequestNamingTheField) {
  try {
    CudaIpcHandle::from_hex("abc", "segment.cuda_ipc");
    FAIL() << "a short handle was accepted";
  } catch (const BadRequestError& e) {
    EXPECT_NE(std::string(e.what()).find("segment.cuda_ipc"), std::string::npos) << e.what();
  }
  std::string bad(2 * CudaIpcHandle::kBytes, '0');
  bad[5] = 'x';
  EXPECT_THROW(CudaIpcHandle::from_hex(bad), BadRequestError);
}

// Reads exactly `size` bytes within `timeout_ms`; false on EOF or timeout.
bool read_all(int fd, void* out, std::size_t size, int timeout_ms) {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
    const ssize_t n = ::read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// The engine's side, in a child forked before the parent touched CUDA: opens the handle, copies
// the buffer to the host and a slice device to device, checks both, and a range past the end;
// then opens it again announcing twice its size, which must be refused.
int engine_side(int from_trainer) {
  char hex[2 * CudaIpcHandle::kBytes];
  if (!read_all(from_trainer, hex, sizeof hex, 120'000)) return 0;  // the parent skipped
  try {
    const CudaIpcHandle handle = CudaIpcHandle::from_hex(std::string_view(hex, sizeof hex));
    {
      const auto want = pattern(kBytes, kSeed);
      CudaIpcMapping mapping(handle, kBytes);
      std::vector<std::uint8_t> host(kBytes);
      mapping.copy_to_host(host.data(), 0, kBytes);
      if (host != want) return 2;
      DeviceBuffer slice(0, 4096);
      mapping.copy_to_device(slice.data(), kBytes - 4096, 4096);
      const auto back = slice.download();
      if (!std::equal(back.begin(), back.end(), want.end() - 4096)) return 3;
      try {
        mapping.copy_to_host(host.data(), kBytes - 10, 11);
        return 4;
      } catch (const EnforceError&) {
      }
    }      // closed: the handle is opened once at a time
    try {  // more announced than was exported: refused before any copy
      CudaIpcMapping oversized(handle, 2 * kBytes);
      return 6;
    } catch (const BadRequestError&) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine side: %s\n", e.what());
    return 5;
  }
  return 0;
}

TEST(NcclColocateCudaIpc, AnotherProcessReadsTheExportedBuffer) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[1]);
    ::_exit(engine_side(pipe_fds[0]));
  }
  ::close(pipe_fds[0]);
  auto reap = [&] {
    int status = 0;
    for (int i = 0; i < 1200 && ::waitpid(child, &status, WNOHANG) == 0; ++i) ::usleep(100'000);
    if (::waitpid(child, &status, WNOHANG) == 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string why;
  try {
    why = nccl_testing::cuda_skip_reason(1);
  } catch (...) {
    ::close(pipe_fds[1]);
    reap();
    throw;
  }
  if (!why.empty()) {
    ::close(pipe_fds[1]);
    EXPECT_EQ(reap(), 0);
    GTEST_SKIP() << why;
  }
  // The trainer's end as the colocated sender uses it (CudaIpcSegment: written from the host,
  // exported once); a write past its end is refused.
  CudaIpcSegment segment(kBytes);
  const auto bytes = pattern(kBytes, kSeed);
  segment.write(0, bytes.data(), kBytes);
  EXPECT_THROW(segment.write(kBytes - 10, bytes.data(), 11), EnforceError);
  const std::string hex = segment.handle().to_hex();
  ASSERT_EQ(::write(pipe_fds[1], hex.data(), hex.size()), static_cast<ssize_t>(hex.size()));
  ::close(pipe_fds[1]);
  EXPECT_EQ(reap(), 0) << "the engine process failed (2: bytes differ, 3: device slice differs, "
                          "4: an out-of-range copy was allowed, 5: CUDA refused, 6: a size past "
                          "the allocation was accepted)";
}

}  // namespace
}  // namespace weightcast::comm::colocate

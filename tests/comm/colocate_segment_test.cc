// Colocated transport: memfd segments and the SCM_RIGHTS handle exchange, with real processes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "comm/colocate/handle_exchange.h"
#include "comm/colocate/segment.h"
#include "comm/errors.h"
#include "sync/model/checksum.h"
#include "tests/support/dev_shm.h"

namespace weightcast::comm::colocate {
namespace {

using namespace std::chrono_literals;

std::set<std::string> dev_shm() {
  return weightcast::testing::dev_shm_names();
}

struct Pair {
  int a = -1;
  int b = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = fds[0];
    b = fds[1];
  }
  ~Pair() {
    if (a >= 0) close(a);
    if (b >= 0) close(b);
  }
};

void fill(std::span<std::byte> bytes) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  }
}

int wait_child(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The engine-side child: receive, map, copy+hash in one pass, compare to `want`.
int engine_child(int socket, const std::string& token, sync::Digest want) {
  try {
    const ReceivedHandle handle = receive_handle(socket, token, 5000ms);
    MappedSegment mapped(handle.fd, handle.size);
    std::vector<std::byte> staging(handle.size);
    sync::Hasher hasher;
    mapped.copy_through(
        0, staging, [&](std::span<const std::byte> c) { hasher.update(c); }, 4096);
    if (hasher.digest() != want || sync::tensor_digest(staging) != want) return 2;
    const char done = 'r';  // release: the trainer may reuse the buffer
    return write(socket, &done, 1) == 1 ? 0 : 3;
  } catch (...) {
    return 1;
  }
}

TEST(ColocateSegment, EngineProcessCopiesAndHashesInOnePass) {
  const auto before = dev_shm();
  {
    SharedSegment segment(3 * 1024 * 1024 + 17);
    fill(segment.bytes());
    const sync::Digest want = sync::tensor_digest(segment.bytes());
    Pair pair;
    const pid_t pid = fork();
    if (pid == 0) {
      close(pair.a);
      _exit(engine_child(pair.b, "tok-1", want));
    }
    send_handle(pair.a, "tok-1", segment.reader_fd(), segment.size());
    char released = 0;
    EXPECT_EQ(read(pair.a, &released, 1), 1);
    EXPECT_EQ(released, 'r');
    EXPECT_EQ(wait_child(pid), 0);
    // Double buffering: after the release the trainer rewrites the same segment.
    fill(segment.bytes().subspan(1));
  }
  EXPECT_EQ(dev_shm(), before);
}

TEST(ColocateSegment, ForeignTokenIsRefusedAndTheDescriptorClosed) {
  SharedSegment segment(4096);
  Pair pair;
  send_handle(pair.a, "someone-else", segment.reader_fd(), segment.size());
  EXPECT_THROW(receive_handle(pair.b, "tok-1", 1000ms), Error);
}

TEST(ColocateSegment, ReceiveTimesOutWithoutASender) {
  Pair pair;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(receive_handle(pair.b, "tok", 150ms), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(ColocateSegment, WrongSizeAndOutOfRangeAreRefused) {
  SharedSegment segment(8192);
  Pair pair;
  send_handle(pair.a, "t", segment.reader_fd(), segment.size());
  const ReceivedHandle handle = receive_handle(pair.b, "t", 1000ms);
  EXPECT_THROW(MappedSegment(dup(handle.fd), 4096), Error);
  MappedSegment mapped(handle.fd, 8192);
  std::vector<std::byte> staging(4096);
  EXPECT_THROW(mapped.copy_through(8192 - 100, staging, nullptr), Error);
  EXPECT_THROW(mapped.copy_through(~std::size_t{0}, staging, nullptr), Error);
}

TEST(ColocateSegment, ReaderHandleCannotBeMappedWritable) {
  SharedSegment segment(4096);
  void* writable = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, segment.reader_fd(), 0);
  EXPECT_EQ(writable, MAP_FAILED);
}

TEST(ColocateSegment, NonSealedDescriptorIsRefused) {
  Pair pair;  // a socket is not a size-sealed memfd
  EXPECT_THROW(MappedSegment(dup(pair.a), 4096), Error);
}

TEST(ColocateSegment, TrainerKilledAfterSendLeavesNothingBehind) {
  const auto before = dev_shm();
  Pair pair;
  const pid_t pid = fork();
  if (pid == 0) {
    close(pair.b);
    SharedSegment segment(1 << 20);
    fill(segment.bytes());
    send_handle(pair.a, "tok", segment.reader_fd(), segment.size());
    pause();  // killed mid-bucket
    _exit(0);
  }
  close(pair.a);
  pair.a = -1;
  const ReceivedHandle handle = receive_handle(pair.b, "tok", 5000ms);
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_child(pid), 128 + SIGKILL);
  {
    MappedSegment mapped(handle.fd, handle.size);  // still readable; the engine decides
    std::vector<std::byte> staging(mapped.size());
    mapped.copy_through(0, staging, nullptr);
    EXPECT_EQ(staging[1], static_cast<std::byte>(138));
  }
  EXPECT_EQ(dev_shm(), before);
}

// find_shared(): a span inside a live segment is found with its offset; one that crosses its
// end, or lies in memory of no segment, is not; a moved segment stays registered, a destroyed
// one does not.
TEST(ColocateSegment, FindSharedLocatesSpansOfLiveSegmentsOnly) {
  SharedSegment segment(1 << 20);
  std::byte* base = segment.bytes().data();
  auto where = find_shared({base + 4096, 100});
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->reader_fd, segment.reader_fd());
  EXPECT_EQ(where->segment_size, std::size_t{1} << 20);
  EXPECT_EQ(where->offset, 4096u);
  EXPECT_FALSE(find_shared({base + (1 << 20) - 10, 20}).has_value());
  std::vector<std::byte> elsewhere(64);
  EXPECT_FALSE(find_shared({elsewhere.data(), elsewhere.size()}).has_value());

  SharedSegment moved(std::move(segment));
  EXPECT_TRUE(find_shared({base, 1}).has_value());
  { SharedSegment gone(std::move(moved)); }
  EXPECT_FALSE(find_shared({base, 1}).has_value());
}

}  // namespace
}  // namespace weightcast::comm::colocate

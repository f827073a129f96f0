// Kept mappings of the colocated path (comm/colocate/segment_mappings.h): an engine keeps its
// read-only mapping of a trainer segment between updates while the trainer keeps the segment, and
// drops it when the trainer lets the segment go, destroys its server, or dies (a real process).
#include "comm/colocate/segment_mappings.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/colocate/segment.h"
#include "comm/colocate/segment_server.h"
#include "comm/errors.h"

namespace weightcast::comm::colocate {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kSize = std::size_t{8} << 20;

void fill(std::span<std::byte> bytes, unsigned step) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>((i * 131 + step) & 0xff);
  }
}

// Waits (bounded) for `condition`; generous, as the suite runs on a busy machine.
bool eventually(const std::function<bool()>& condition) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

// Serves `segment` once to one engine rank on `server`, in the background.
class ServeOnce {
 public:
  ServeOnce(SegmentServer& server, const std::string& token, const SharedSegment& segment)
      : thread_([&server, token, fd = segment.reader_fd(), size = segment.size()] {
          try {
            server.serve(token, fd, size, 1, deadline_after(10s));
          } catch (const Error&) {
            // the engine side reports what it did not get
          }
        }) {}
  ~ServeOnce() { thread_.join(); }

 private:
  std::thread thread_;
};

std::shared_ptr<const MappedSegment> map_from(SegmentMappings& mappings, SegmentServer& server,
                                              const SharedSegment& segment,
                                              const std::string& token = "tok") {
  ServeOnce serving(server, token, segment);
  return mappings.map(server.name(), token, segment.size(), 10s);
}

std::vector<std::byte> copy_all(const MappedSegment& mapped) {
  std::vector<std::byte> out(mapped.size());
  mapped.copy_through(0, out, nullptr);
  return out;
}

bool maps_memfd_named(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:" + name) != std::string::npos) return true;
  }
  return false;
}

// A mapping is kept between copies, populated in the background after its first copy, then read
// out of the mapping, always the segment's current bytes (the trainer writes the next step into
// the same memory).
TEST(ColocateMappings, KeptMappingIsReusedPopulatedAndReadsCurrentBytes) {
  SharedSegment segment(kSize);
  fill(segment.bytes(), 1);
  SegmentServer server;
  SegmentMappings mappings;

  const auto first = map_from(mappings, server, segment);
  EXPECT_FALSE(first->populated());
  EXPECT_TRUE(std::ranges::equal(copy_all(*first), segment.bytes()));
  mappings.done(*first);
  ASSERT_TRUE(eventually([&] { return mappings.stats().populated == 1; }));
  EXPECT_TRUE(first->populated());

  fill(segment.bytes(), 2);  // the next step
  const auto second = map_from(mappings, server, segment);
  EXPECT_EQ(second.get(), first.get());
  EXPECT_TRUE(std::ranges::equal(copy_all(*second), segment.bytes()));
  mappings.done(*second);
  const auto stats = mappings.stats();
  EXPECT_EQ(stats.kept, 1u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(server.held(), 1u);  // the kept mapping's connection; the second one was closed
}

// A partly populated mapping: ranges before, across and after the populated part read the same
// bytes as pread would (memcpy out of the mapping up to the boundary, pread beyond).
TEST(ColocateMappings, CopiesAcrossThePopulatedBoundaryAreExact) {
  SharedSegment segment(kSize);
  fill(segment.bytes(), 5);
  SegmentServer server;
  SegmentMappings mappings({.keep = false});  // no background thread: populate by hand
  const auto shared = map_from(mappings, server, segment);
  auto& mapped = const_cast<MappedSegment&>(*shared);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(mapped.populate(3 * page - 100), 3 * page);  // rounded up to whole pages
  const std::size_t boundary = mapped.populated_bytes();
  for (const auto& [offset, length] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, boundary},                // all populated
           {100, boundary},              // across the boundary
           {boundary - 1, 2},            // one byte on each side
           {boundary, page + 7},         // starts at it
           {boundary + 3, 3 * page},     // beyond it
           {kSize - 4096 - 5, 4096 + 5}  // the segment's end
       }) {
    std::vector<std::byte> out(length);
    std::size_t visited = 0;
    mapped.copy_through(
        offset, out, [&](std::span<const std::byte> chunk) { visited += chunk.size(); }, 1000);
    EXPECT_EQ(visited, length) << offset;
    EXPECT_TRUE(std::ranges::equal(out, segment.bytes().subspan(offset, length))) << offset;
  }
  std::vector<std::byte> past_the_end(11);
  EXPECT_THROW(mapped.copy_through(kSize - 10, past_the_end, nullptr), Error);
}

// Every map() checks the token, kept mapping or not.
TEST(ColocateMappings, EveryMapChecksTheToken) {
  SharedSegment segment(kSize);
  SegmentServer server;
  SegmentMappings mappings;
  mappings.done(*map_from(mappings, server, segment, "right"));
  {
    ServeOnce serving(server, "right", segment);
    EXPECT_THROW(mappings.map(server.name(), "wrong", segment.size(), 10s), Error);
  }
  {
    ServeOnce serving(server, "right", segment);
    EXPECT_THROW(mappings.map(server.name(), "right", segment.size() - 4096, 10s), Error);
  }
  EXPECT_EQ(mappings.stats().kept, 1u);
}

// Destroying the segment closes the connections of the engines that took it: they drop it.
TEST(ColocateMappings, DroppedWhenTheTrainerDestroysTheSegment) {
  const std::string name = "wc-mappings-test-" + std::to_string(::getpid());
  SegmentServer server;
  SegmentMappings mappings;
  auto segment = std::make_optional<SharedSegment>(kSize, name);
  {
    auto mapped = map_from(mappings, server, *segment);
    mappings.done(*mapped);
  }
  ASSERT_EQ(mappings.stats().kept, 1u);
  segment.reset();
  ASSERT_TRUE(eventually([&] { return mappings.stats().kept == 0; }));
  EXPECT_EQ(mappings.stats().dropped, 1u);
  EXPECT_EQ(server.held(), 0u);
  EXPECT_FALSE(maps_memfd_named(name));  // the memory is gone from this process
}

// So does destroying the server (a trainer's sender going away).
TEST(ColocateMappings, DroppedWhenTheTrainerDestroysItsServer) {
  SharedSegment segment(kSize);
  SegmentMappings mappings;
  {
    SegmentServer server;
    mappings.done(*map_from(mappings, server, segment));
    ASSERT_EQ(mappings.stats().kept, 1u);
  }
  EXPECT_TRUE(eventually([&] { return mappings.stats().kept == 0; }));
}

// A trainer process killed after handing its segment over: the kernel closes its connection and
// the engine drops the mapping, so nothing of the dead trainer stays mapped.
TEST(ColocateMappings, DroppedWhenTheTrainerProcessDies) {
  const std::string memfd_name = "wc-mappings-dead-" + std::to_string(::getpid());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    try {
      SharedSegment segment(kSize, memfd_name);
      fill(segment.bytes(), 3);
      SegmentServer server;
      const std::string line = server.name() + "\n";
      if (::write(pipe_fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        _exit(2);
      }
      server.serve("tok", segment.reader_fd(), segment.size(), 1, deadline_after(20s));
      ::pause();  // killed
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  ::close(pipe_fds[1]);
  struct Reap {  // the child never outlives the test, however it ends
    pid_t pid;
    bool reaped = false;
    ~Reap() {
      if (!reaped && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  std::string name;
  char c = 0;
  while (::read(pipe_fds[0], &c, 1) == 1 && c != '\n') name += c;
  ::close(pipe_fds[0]);
  ASSERT_FALSE(name.empty());

  SegmentMappings mappings;
  {
    const auto mapped = mappings.map(name, "tok", kSize, 10s);
    const auto bytes = copy_all(*mapped);
    EXPECT_EQ(bytes[1], static_cast<std::byte>(134));
    mappings.done(*mapped);
  }
  EXPECT_EQ(mappings.stats().kept, 1u);
  EXPECT_TRUE(maps_memfd_named(memfd_name));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  reap.reaped = true;
  ASSERT_TRUE(eventually([&] { return mappings.stats().kept == 0; }));
  EXPECT_FALSE(maps_memfd_named(memfd_name));
}

// At most max_segments are kept; the least recently used goes first.
TEST(ColocateMappings, AtMostMaxSegmentsAreKept) {
  SegmentServer server;
  SegmentMappings mappings({.keep = true, .max_segments = 2});
  SharedSegment a(kSize), b(kSize), c(kSize);
  const auto ma = map_from(mappings, server, a);
  mappings.done(*ma);
  mappings.done(*map_from(mappings, server, b));
  mappings.done(*map_from(mappings, server, a));  // a is now the most recent
  mappings.done(*map_from(mappings, server, c));  // b goes
  auto stats = mappings.stats();
  EXPECT_EQ(stats.kept, 2u);
  EXPECT_EQ(stats.dropped, 1u);
  EXPECT_EQ(map_from(mappings, server, a).get(), ma.get());  // still kept
  EXPECT_TRUE(eventually([&] { return server.held() == 2; }));
}

// keep = false: a fresh mapping every time, none kept, no connection held.
TEST(ColocateMappings, WithoutKeepEveryMapIsFresh) {
  SharedSegment segment(kSize);
  fill(segment.bytes(), 4);
  SegmentServer server;
  SegmentMappings mappings({.keep = false});
  const auto first = map_from(mappings, server, segment);
  EXPECT_TRUE(std::ranges::equal(copy_all(*first), segment.bytes()));
  mappings.done(*first);
  const auto second = map_from(mappings, server, segment);
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(mappings.stats().kept, 0u);
  EXPECT_TRUE(eventually([&] { return server.held() == 0; }));
}

}  // namespace
}  // namespace weightcast::comm::colocate

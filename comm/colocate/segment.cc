#include "comm/colocate/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "comm/colocate/segment_server.h"
#include "comm/errors.h"

namespace weightcast::comm::colocate {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

[[noreturn]] void fail(const std::string& what) {
  throw Error("colocated segment: " + what + ": " + std::strerror(errno));
}

// The live segments of this process, by base address: reader descriptor and size.
struct Registry {
  std::mutex mu;
  std::map<const std::byte*, std::pair<int, std::size_t>, std::greater<>> segments;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: segments may outlive static destructors
  return *r;
}

SegmentId id_of(const struct stat& info) {
  return {static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino)};
}

}  // namespace

SegmentId segment_id(int fd) {
  struct stat info {};
  if (fstat(fd, &info) != 0) fail("fstat");
  return id_of(info);
}

std::optional<SharedLocation> find_shared(std::span<const std::byte> bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  // The segment with the highest base at or below bytes.data().
  auto it = r.segments.lower_bound(bytes.data());
  if (it == r.segments.end()) return std::nullopt;
  const auto offset = static_cast<std::size_t>(bytes.data() - it->first);
  const auto [fd, size] = it->second;
  if (offset > size || bytes.size() > size - offset) return std::nullopt;
  return SharedLocation{fd, size, offset};
}

SharedSegment::SharedSegment(std::size_t size, const std::string& name) : size_(size) {
  if (size == 0) {
    throw Error("colocated segment: size must be > 0");
  }
  fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) {
    fail("memfd_create");
  }
  if (ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    release();
    fail("ftruncate");
  }
  if (fcntl(fd_, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    release();
    fail("F_ADD_SEALS");
  }
  void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (mapped == MAP_FAILED) {
    release();
    fail("mmap");
  }
  data_ = static_cast<std::byte*>(mapped);
  const std::string self = "/proc/self/fd/" + std::to_string(fd_);
  reader_fd_ = open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (reader_fd_ < 0) {
    release();
    fail("reopen read-only");
  }
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.segments[data_] = {reader_fd_, size_};
}

SharedSegment::~SharedSegment() {
  release();
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      reader_fd_(std::exchange(other.reader_fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    reader_fd_ = std::exchange(other.reader_fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedSegment::release() noexcept {
  if (data_ != nullptr) {
    {
      Registry& r = registry();
      std::lock_guard lock(r.mu);
      r.segments.erase(data_);
    }
    munmap(data_, size_);
    data_ = nullptr;
  }
  if (reader_fd_ >= 0) {
    // Engines keep their mappings while the connection they took the handle on stays open: close
    // those connections, so that no engine holds this memory once the trainer has let it go.
    struct stat info {};
    if (fstat(reader_fd_, &info) == 0) SegmentServer::release_everywhere(id_of(info));
    close(reader_fd_);
    reader_fd_ = -1;
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

MappedSegment::MappedSegment(int fd, std::size_t expected_size) : fd_(fd) {
  const int seals = fcntl(fd_, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    release();
    throw Error("colocated segment: the handle is not a size-sealed memfd");
  }
  const int mode = fcntl(fd_, F_GETFL);
  if (mode < 0 || (mode & O_ACCMODE) != O_RDONLY) {
    release();
    throw Error("colocated segment: the handle is not read-only");
  }
  struct stat info {};
  if (fstat(fd_, &info) != 0 || static_cast<std::size_t>(info.st_size) != expected_size ||
      expected_size == 0) {
    release();
    throw Error("colocated segment: size " + std::to_string(info.st_size) + " != expected " +
                std::to_string(expected_size));
  }
  void* mapped = mmap(nullptr, expected_size, PROT_READ, MAP_SHARED, fd_, 0);
  if (mapped == MAP_FAILED) {
    release();
    fail("mmap read-only");
  }
  data_ = static_cast<const std::byte*>(mapped);
  size_ = expected_size;
  id_ = id_of(info);
}

MappedSegment::~MappedSegment() {
  release();
}

MappedSegment::MappedSegment(MappedSegment&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      id_(std::exchange(other.id_, {})),
      populated_(other.populated_.exchange(0)) {}

MappedSegment& MappedSegment::operator=(MappedSegment&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    id_ = std::exchange(other.id_, {});
    populated_.store(other.populated_.exchange(0));
  }
  return *this;
}

std::size_t MappedSegment::populate(std::size_t bytes) {
  const std::size_t from = populated_bytes();
  if (data_ == nullptr || from == size_) return from;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t n = std::min((bytes + page - 1) / page * page, size_ - from);
  auto* start = const_cast<std::byte*>(data_ + from);
  if (madvise(start, n, MADV_POPULATE_READ) != 0 && errno != EINVAL) {
    fail("madvise(MADV_POPULATE_READ)");  // EINVAL: a kernel before 5.14, the reads below do it
  }
  // Read a byte of every page as well: under a hypervisor that shadows page tables, the first
  // access through a new entry is what costs (measured: a mapping populated by madvise alone
  // made the next copy out of it 6x slower than the one after).
  volatile std::uint8_t sink = 0;
  for (std::size_t at = 0; at < n; at += page) {
    sink = sink ^ static_cast<std::uint8_t>(start[at]);
  }
  populated_.store(from + n, std::memory_order_release);
  return from + n;
}

void MappedSegment::release() noexcept {
  populated_.store(0);
  if (data_ != nullptr) {
    munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

void MappedSegment::copy_through(std::size_t offset, std::span<std::byte> destination,
                                 const ChunkVisitor& visit, std::size_t chunk_bytes) const {
  if (offset > size_ || destination.size() > size_ - offset) {
    throw Error("colocated segment: range [" + std::to_string(offset) + ", +" +
                std::to_string(destination.size()) + ") outside the segment of " +
                std::to_string(size_) + " bytes");
  }
  if (chunk_bytes == 0) {
    chunk_bytes = destination.size();
  }
  // The populated part out of the mapping; populated_bytes() only grows, so a snapshot holds.
  const std::size_t mapped_in = populated_bytes();
  std::size_t done = 0;
  while (done < destination.size() && offset + done < mapped_in) {
    const std::size_t n =
        std::min({chunk_bytes, destination.size() - done, mapped_in - (offset + done)});
    std::memcpy(destination.data() + done, data_ + offset + done, n);
    if (visit) visit(destination.subspan(done, n));
    done += n;
  }
  // The rest: pread, not the mapping: the kernel copies out of the shared pages as process_vm_readv
  // would, while reading through a fresh mapping faults every 4 KiB page into this process first
  // (shared memory rarely gets huge pages), which measured as the larger part of the copy.
  while (done < destination.size()) {
    const std::size_t n = std::min(chunk_bytes, destination.size() - done);
    const ssize_t got =
        ::pread(fd_, destination.data() + done, n, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail("pread");
    const auto read = static_cast<std::size_t>(got);
    if (visit) {
      visit(destination.subspan(done, read));
    }
    done += read;
  }
}

}  // namespace weightcast::comm::colocate

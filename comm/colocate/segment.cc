#include "comm/colocate/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "comm/errors.h"

namespace weightcast::comm::colocate {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

[[noreturn]] void fail(const std::string& what) {
  throw Error("colocated segment: " + what + ": " + std::strerror(errno));
}

}  // namespace

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
    munmap(data_, size_);
    data_ = nullptr;
  }
  if (reader_fd_ >= 0) {
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
}

MappedSegment::~MappedSegment() {
  release();
}

MappedSegment::MappedSegment(MappedSegment&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedSegment& MappedSegment::operator=(MappedSegment&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedSegment::release() noexcept {
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
  for (std::size_t done = 0; done < destination.size(); done += chunk_bytes) {
    const std::size_t n = std::min(chunk_bytes, destination.size() - done);
    std::memcpy(destination.data() + done, data_ + offset + done, n);
    if (visit) {
      visit(destination.subspan(done, n));
    }
  }
}

}  // namespace weightcast::comm::colocate

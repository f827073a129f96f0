// Colocated transport, step one: a bucket laid out once in anonymous shared memory.
//
// SharedSegment (trainer side) owns a memfd of a fixed size, mapped read-write. Its size is
// sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so a reader that mapped it can never be hit
// by SIGBUS from a truncation. reader_fd() is a separate O_RDONLY descriptor of the same memory:
// that is what goes to engines, and a read-only descriptor cannot be mapped writable and shared.
// A memfd has no name in /dev/shm; the kernel frees it when the last descriptor and mapping are
// gone, so a process that dies leaves nothing behind.
//
// MappedSegment (engine side) maps a received descriptor read-only after checking its size and
// seals, and copy_through() copies a byte range into the caller's staging in cache-sized chunks,
// handing each chunk to a visitor (e.g. an XXH3 hasher) while it is still in cache: one pass.
// Every live SharedSegment is registered by address (find_shared()).
// Lifetime/threading: both are move-only, single-thread objects; destruction unmaps and closes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace weightcast::comm::colocate {

class SharedSegment {
 public:
  // Creates a sealed memfd of exactly `size` bytes (> 0). Throws comm::Error on failure.
  explicit SharedSegment(std::size_t size, const std::string& name = "weightcast-bucket");
  ~SharedSegment();
  SharedSegment(SharedSegment&&) noexcept;
  SharedSegment& operator=(SharedSegment&&) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::span<std::byte> bytes() { return {data_, size_}; }
  std::size_t size() const { return size_; }
  // A read-only descriptor of the segment, owned by this object; send it, do not close it.
  int reader_fd() const { return reader_fd_; }

 private:
  void release() noexcept;

  int fd_ = -1;
  int reader_fd_ = -1;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Where `bytes` lie inside a live SharedSegment of this process: the segment's read-only
// descriptor (owned by the segment), its size and the offset of bytes.data() in it; nullopt when
// they do not lie wholly inside one. Lets a sender hand memory that already is a segment (a
// TensorArena made shared) to engines as it is, without copying it into one. Thread-safe.
struct SharedLocation {
  int reader_fd = -1;
  std::size_t segment_size = 0;
  std::size_t offset = 0;
};
std::optional<SharedLocation> find_shared(std::span<const std::byte> bytes);

class MappedSegment {
 public:
  using ChunkVisitor = std::function<void(std::span<const std::byte>)>;

  // Takes ownership of `fd`. Throws comm::Error if it is not a memfd whose size is sealed, if
  // its size is not `expected_size`, or if it is writable through this descriptor.
  MappedSegment(int fd, std::size_t expected_size);
  ~MappedSegment();
  MappedSegment(MappedSegment&&) noexcept;
  MappedSegment& operator=(MappedSegment&&) noexcept;
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }

  // Copies [offset, offset + destination.size()) into `destination` chunk by chunk, calling
  // `visit` on each copied chunk of the destination. Throws comm::Error on an out-of-range
  // request (nothing copied).
  void copy_through(std::size_t offset, std::span<std::byte> destination, const ChunkVisitor& visit,
                    std::size_t chunk_bytes = 256 * 1024) const;

 private:
  void release() noexcept;

  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace weightcast::comm::colocate

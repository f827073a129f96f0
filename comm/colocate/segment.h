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
// It copies the part of the mapping populate() has mapped in with memcpy out of it (no per-page
// lookup: 2-3x faster than pread here), the rest with pread (through the kernel's own mapping: a
// fresh mapping of shared memory faults every 4 KiB page first, the larger cost on a virtual
// machine).
// Every live SharedSegment is registered by address (find_shared()); destroying one closes the
// connections its engines keep to hold their mappings of it (segment_server.h).
// Lifetime/threading: both are move-only objects; destruction unmaps and closes. A
// MappedSegment's copy_through() and populate() may run on different threads at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace weightcast::comm::colocate {

// Which memory a descriptor refers to (its inode): two descriptors of one memfd have the same id,
// and no other live memory has it.
struct SegmentId {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool operator==(const SegmentId&) const = default;
  auto operator<=>(const SegmentId&) const = default;
};
// Throws comm::Error when `fd` cannot be stat()ed.
SegmentId segment_id(int fd);

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
  SegmentId id() const { return id_; }

  // Copies [offset, offset + destination.size()) into `destination` chunk by chunk, calling
  // `visit` on each copied chunk of the destination. Throws comm::Error on an out-of-range
  // request (nothing copied).
  void copy_through(std::size_t offset, std::span<std::byte> destination, const ChunkVisitor& visit,
                    std::size_t chunk_bytes = 256 * 1024) const;

  // Maps the next `bytes` (page-rounded) of the segment into this process after the part already
  // populated (MADV_POPULATE_READ, or a read of each page where the kernel lacks it), so that
  // later copies of that part read the mapping itself; returns the bytes populated so far.
  // Costs about what faulting the pages costs (~0.5 ms per MiB measured here): worth it only
  // for a mapping kept across updates. Throws comm::Error if the kernel refuses. One thread.
  std::size_t populate(std::size_t bytes);
  std::size_t populated_bytes() const { return populated_.load(std::memory_order_acquire); }
  bool populated() const { return populated_bytes() == size_; }

 private:
  void release() noexcept;

  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  SegmentId id_;
  std::atomic<std::size_t> populated_{0};  // [0, populated_) is mapped in
};

}  // namespace weightcast::comm::colocate

// Host memory for large receive buffers, backed by transparent huge pages where the kernel has
// them. On one host, Open MPI's shared-memory transport copies a large message straight into the
// receiver's memory (cross-memory attach), and into fresh small pages that copy ran an order of
// magnitude slower than into huge pages, whether or not the pages had been written before
// (docs/performance.md, "The stage gather, fixed").
//
// HugePageAllocator is a std::allocator drop-in: requests of at least kHugePageBytes are
// anonymous mappings advised MADV_HUGEPAGE (advice only: with huge pages off, they are small
// pages, as before); smaller ones come from operator new. Stateless; all instances are equal.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace weightcast::comm {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// The untyped halves; throw std::bad_alloc.
void* allocate_huge_pages(std::size_t bytes);
void free_huge_pages(void* p, std::size_t bytes);

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: allocator rebinding

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate_huge_pages(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { free_huge_pages(p, n * sizeof(T)); }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

// Bytes in huge-page-backed memory (for buffers of at least kHugePageBytes).
using HugePageBytes = std::vector<std::byte, HugePageAllocator<std::byte>>;

}  // namespace weightcast::comm

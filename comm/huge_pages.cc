#include "comm/huge_pages.h"

#include <sys/mman.h>

namespace weightcast::comm {

void* allocate_huge_pages(std::size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only; fails harmlessly where THP is absent
  return p;
}

void free_huge_pages(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
    return;
  }
  munmap(p, bytes);
}

}  // namespace weightcast::comm

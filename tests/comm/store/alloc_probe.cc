#include "tests/comm/store/alloc_probe.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

namespace weightcast::testing {
namespace {

std::atomic<std::size_t> g_largest{0};

void record(std::size_t n) {
  std::size_t seen = g_largest.load(std::memory_order_relaxed);
  while (n > seen && !g_largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}

void* allocate(std::size_t n) {
  record(n);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

}  // namespace

void reset_largest_allocation() {
  g_largest.store(0);
}
std::size_t largest_allocation() {
  return g_largest.load();
}

std::size_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

}  // namespace weightcast::testing

void* operator new(std::size_t n) {
  return weightcast::testing::allocate(n);
}
void* operator new[](std::size_t n) {
  return weightcast::testing::allocate(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

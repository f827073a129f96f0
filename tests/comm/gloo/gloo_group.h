// Helpers of the Gloo unit tests that run ranks as threads over a memory store.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"

namespace weightcast::comm::testing {

inline std::shared_ptr<Store> fresh_store(const std::string& name) {
  return std::make_shared<PrefixStore>(name, std::make_shared<MemoryStore>());
}

// Small chunks, so multi-chunk paths run with small buffers.
inline CommOptions options(std::shared_ptr<Store> store, int rank, int size,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  CommOptions o = member_options(std::move(store), rank, size, timeout);
  o.gloo.chain.chunk_bytes = 1000;
  o.gloo.chain.chunks_in_flight = 2;
  return o;
}

// Runs fn(rank, communicator) for each rank on its own thread, with options() passed through
// `adjust`; rethrows the first failure.
template <typename Fn>
void with_group(int size, const std::string& name, Fn fn,
                const std::function<void(CommOptions&)>& adjust = {}) {
  auto store = fresh_store(name);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions o = options(store, r, size);
        if (adjust) adjust(o);
        auto c = create_gloo_communicator(o);
        fn(r, *c);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

inline std::vector<std::uint8_t> pattern(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(gen());
  return v;
}

}  // namespace weightcast::comm::testing

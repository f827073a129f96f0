// Backend conformance suite: the tests every Communicator backend must pass, written once and
// instantiated per backend (ranks run as threads over one in-memory store).
//
// To instantiate it for a backend, write one test source, e.g.
// tests/comm/nccl/nccl_conformance_test.cc:
//
//   #include "tests/comm/conformance/conformance.h"
//
//   static weightcast::testing::BackendSpec nccl_spec() {
//     weightcast::testing::BackendSpec s;
//     s.name = "nccl";
//     s.memory = weightcast::comm::MemoryKind::kCuda;
//     s.skip_reason = [](int world) -> std::string { /* "needs 4 GPUs, found 0"; "" = run */ };
//     s.configure_rank = [](int rank, weightcast::comm::CommOptions& o) { o.cuda_device = rank; };
//     s.create = [](const weightcast::comm::CommOptions& o) {
//       return weightcast::comm::create_communicator("nccl", o);
//     };
//     s.alloc = ...;  s.free = ...;  s.copy_to_buffer = ...;  s.copy_from_buffer = ...;
//     return s;
//   }
//   WC_INSTANTIATE_CONFORMANCE(Nccl, nccl_spec());
//
// and register it: weightcast_add_test(nccl_conformance_test SOURCES nccl_conformance_test.cc
// LIBS weightcast_conformance weightcast_comm). Use the macro once per binary, at global scope.
// The TEST_Ps live in the weightcast_conformance static library; the macro references an anchor
// in it so the linker keeps them (`--gtest_list_tests` shows every case). A case whose
// skip_reason is non-empty calls GTEST_SKIP() with that reason. configure_rank runs on the rank's
// own thread before alloc/create, so a CUDA backend can select the rank's device there.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace weightcast::testing {

struct BackendSpec {
  std::string name;  // also the test-name suffix: letters, digits, '_'
  comm::MemoryKind memory = comm::MemoryKind::kHost;
  // Empty string: runnable with this many ranks; otherwise why not (printed by GTEST_SKIP).
  std::function<std::string(int world_size)> skip_reason;
  std::function<std::unique_ptr<comm::Communicator>(const comm::CommOptions&)> create;
  // Optional: adjust the options of one rank (device ordinal, ...); runs on that rank's thread.
  std::function<void(int rank, comm::CommOptions&)> configure_rank;
  // Buffers of `memory` kind, and copies between them and host memory.
  std::function<void*(std::size_t bytes)> alloc;
  std::function<void(void* buffer)> free;
  std::function<void(void* buffer, const void* host, std::size_t bytes)> copy_to_buffer;
  std::function<void(void* host, const void* buffer, std::size_t bytes)> copy_from_buffer;
};

// A spec for a host-memory backend: malloc/free/memcpy helpers, never skipped.
BackendSpec host_backend(
    std::string name,
    std::function<std::unique_ptr<comm::Communicator>(const comm::CommOptions&)> create);

// Suite knobs: small chunks so the multi-chunk cases exercise windowing quickly.
inline constexpr std::size_t kConformanceChunkBytes = 1000;
inline constexpr int kConformanceChunksInFlight = 3;
inline constexpr std::size_t kManyChunksBytes = 23 * kConformanceChunkBytes + 457;

struct BroadcastCase {
  std::shared_ptr<const BackendSpec> backend;
  int world_size = 1;
  int root = 0;
  std::size_t bytes = 0;
  std::string label;  // "w4_root2_4093B"
};

struct BackendCase {
  std::shared_ptr<const BackendSpec> backend;
};

// World sizes {1, 2, 3, 4, 7} x every root x sizes {0, 1, 4093, kManyChunksBytes}.
std::vector<BroadcastCase> broadcast_cases(const BackendSpec& spec);
std::vector<BackendCase> backend_cases(const BackendSpec& spec);

struct BroadcastCaseName {
  std::string operator()(const ::testing::TestParamInfo<BroadcastCase>& info) const {
    return info.param.backend->name + "_" + info.param.label;
  }
};
struct BackendCaseName {
  std::string operator()(const ::testing::TestParamInfo<BackendCase>& info) const {
    return info.param.backend->name;
  }
};

// GoogleTest prints parameters on failure; keep it to the label rather than raw bytes.
inline void PrintTo(const BroadcastCase& c, std::ostream* os) {
  *os << c.backend->name << "/" << c.label;
}
inline void PrintTo(const BackendCase& c, std::ostream* os) {
  *os << c.backend->name;
}

class CommBroadcastConformance : public ::testing::TestWithParam<BroadcastCase> {};
class CommBehaviourConformance : public ::testing::TestWithParam<BackendCase> {};

// Referenced by WC_INSTANTIATE_CONFORMANCE so the linker keeps the suite's TEST_Ps.
int conformance_anchor();

}  // namespace weightcast::testing

#define WC_INSTANTIATE_CONFORMANCE(prefix, spec_expr)                                             \
  namespace weightcast::testing {                                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, CommBroadcastConformance,                                      \
                           ::testing::ValuesIn(broadcast_cases(spec_expr)), BroadcastCaseName{}); \
  INSTANTIATE_TEST_SUITE_P(prefix, CommBehaviourConformance,                                      \
                           ::testing::ValuesIn(backend_cases(spec_expr)), BackendCaseName{});     \
  [[maybe_unused]] static const int wc_conformance_anchor_##prefix = conformance_anchor();        \
  }                                                                                               \
  static_assert(true, "require a semicolon")

// Helpers shared by the conformance TEST_Ps (not needed by code that instantiates the suite):
// ranks as threads, a store scoped per case, buffers of the backend's memory kind, seeded data.
// Threading: run_ranks() starts one thread per rank and joins them all before returning.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"
#include "tests/comm/conformance/conformance.h"

namespace weightcast::testing {

// Generous: a correct backend finishes in milliseconds; a broken one fails instead of hanging.
inline constexpr comm::Millis kConformanceTimeout{20000};

// A PrefixStore over one process-wide MemoryStore, with a prefix no other case uses.
std::shared_ptr<comm::Store> case_store(const std::string& label);

// Options for `rank` of `world` with the suite's chunking and timeout, after configure_rank.
comm::CommOptions rank_options(const BackendSpec& spec, std::shared_ptr<comm::Store> store,
                               int rank, int world);

// Runs body(rank) on `world` threads; returns one message per rank ("" when it returned).
std::vector<std::string> run_ranks(int world, const std::function<void(int rank)>& body);

// Fails the current test with every non-empty message of run_ranks().
void expect_no_rank_errors(const std::vector<std::string>& errors);

// A buffer of the backend's memory kind, freed on scope exit.
class RankBuffer {
 public:
  RankBuffer(const BackendSpec& spec, std::size_t bytes);
  ~RankBuffer();
  RankBuffer(const RankBuffer&) = delete;
  RankBuffer& operator=(const RankBuffer&) = delete;

  void* get() const { return ptr_; }
  void upload(const std::vector<std::uint8_t>& host);
  std::vector<std::uint8_t> download() const;

 private:
  const BackendSpec& spec_;
  std::size_t bytes_;
  void* ptr_ = nullptr;
};

// FNV-1a of `text`: the seed of a case, derived from its name so a failure reproduces.
std::uint64_t seed_of(const std::string& text);
std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed);

// Index of the first byte where `got` differs from `want`, or -1 when equal (sizes included).
long first_mismatch(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want);

}  // namespace weightcast::testing

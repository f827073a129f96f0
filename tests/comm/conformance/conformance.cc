#include "tests/comm/conformance/conformance.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>

#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "tests/comm/conformance/conformance_support.h"

namespace weightcast::testing {

// Defined next to the TEST_Ps, one per source, so referencing this pulls every one in.
int broadcast_tests_anchor();
int behaviour_tests_anchor();

int conformance_anchor() {
  return broadcast_tests_anchor() + behaviour_tests_anchor();
}

BackendSpec host_backend(
    std::string name,
    std::function<std::unique_ptr<comm::Communicator>(const comm::CommOptions&)> create) {
  BackendSpec s;
  s.name = std::move(name);
  s.memory = comm::MemoryKind::kHost;
  s.skip_reason = [](int) { return std::string(); };
  s.create = std::move(create);
  s.alloc = [](std::size_t bytes) { return std::malloc(bytes == 0 ? 1 : bytes); };
  s.free = [](void* p) { std::free(p); };
  s.copy_to_buffer = [](void* dst, const void* src, std::size_t n) {
    if (n > 0) std::memcpy(dst, src, n);
  };
  s.copy_from_buffer = [](void* dst, const void* src, std::size_t n) {
    if (n > 0) std::memcpy(dst, src, n);
  };
  return s;
}

std::vector<BroadcastCase> broadcast_cases(const BackendSpec& spec) {
  auto shared = std::make_shared<const BackendSpec>(spec);
  std::vector<BroadcastCase> out;
  for (int world : {1, 2, 3, 4, 7}) {
    for (int root = 0; root < world; ++root) {
      for (std::size_t bytes :
           {std::size_t{0}, std::size_t{1}, std::size_t{4093}, kManyChunksBytes}) {
        BroadcastCase c;
        c.backend = shared;
        c.world_size = world;
        c.root = root;
        c.bytes = bytes;
        c.label = "w" + std::to_string(world) + "_root" + std::to_string(root) + "_" +
                  std::to_string(bytes) + "B";
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

std::vector<BackendCase> backend_cases(const BackendSpec& spec) {
  return {BackendCase{std::make_shared<const BackendSpec>(spec)}};
}

std::shared_ptr<comm::Store> case_store(const std::string& label) {
  static const auto shared = std::make_shared<comm::MemoryStore>();
  static std::atomic<int> counter{0};
  return std::make_shared<comm::PrefixStore>(label + "#" + std::to_string(counter++), shared);
}

comm::CommOptions rank_options(const BackendSpec& spec, std::shared_ptr<comm::Store> store,
                               int rank, int world) {
  comm::CommOptions o = comm::member_options(std::move(store), rank, world, kConformanceTimeout);
  o.gloo.chain.chunk_bytes = kConformanceChunkBytes;
  o.gloo.chain.chunks_in_flight = kConformanceChunksInFlight;
  if (spec.configure_rank) spec.configure_rank(rank, o);
  return o;
}

std::vector<std::string> run_ranks(int world, const std::function<void(int rank)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto& err = errors[static_cast<std::size_t>(r)];
      try {
        body(r);
      } catch (const std::exception& e) {
        err = "rank " + std::to_string(r) + " threw: " + e.what();
      } catch (...) {
        err = "rank " + std::to_string(r) + " threw a non-std exception";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_rank_errors(const std::vector<std::string>& errors) {
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e;
}

RankBuffer::RankBuffer(const BackendSpec& spec, std::size_t bytes)
    : spec_(spec), bytes_(bytes), ptr_(spec.alloc(bytes)) {
  if (ptr_ == nullptr) throw std::bad_alloc();
}

RankBuffer::~RankBuffer() {
  spec_.free(ptr_);
}

void RankBuffer::upload(const std::vector<std::uint8_t>& host) {
  if (host.size() != bytes_) throw std::logic_error("RankBuffer::upload: size mismatch");
  spec_.copy_to_buffer(ptr_, host.data(), bytes_);
}

std::vector<std::uint8_t> RankBuffer::download() const {
  std::vector<std::uint8_t> host(bytes_);
  spec_.copy_from_buffer(host.data(), ptr_, bytes_);
  return host;
}

std::uint64_t seed_of(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t v = gen();
    for (std::size_t j = i; j < n && j < i + 8; ++j, v >>= 8) out[j] = static_cast<std::uint8_t>(v);
  }
  return out;
}

long first_mismatch(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  const std::size_t n = std::min(got.size(), want.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) return static_cast<long>(i);
  }
  return got.size() == want.size() ? -1 : static_cast<long>(n);
}

}  // namespace weightcast::testing

#include "launcher/bench/broadcast.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "launcher/bench/broadcast_summary.h"
#include "launcher/bench/colocate_backend.h"
#include "launcher/bench/table.h"
#include "launcher/cli_util.h"

namespace weightcast::launcher {
namespace {

using comm::BroadcastOptions;
using comm::Millis;

// A buffer on the host or on the current CUDA device; the check pattern goes through the host.
class BenchBuffer {
 public:
  BenchBuffer(std::size_t bytes, bool device) : bytes_(bytes), device_(device) {
    if (device_) {
      ptr_ = comm::cuda_alloc(bytes_);
    } else {
      host_.resize(bytes_);
      ptr_ = host_.data();
    }
  }
  ~BenchBuffer() {
    if (device_) comm::cuda_free(ptr_);
  }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  void* data() { return ptr_; }
  void fill(std::size_t bytes, std::uint64_t seed, bool poison) {
    std::vector<std::uint8_t> tmp;
    std::uint8_t* dst = device_ ? (tmp.resize(bytes), tmp.data()) : host_.data();
    if (poison) {
      std::memset(dst, 0xA5, bytes);
    } else {
      fill_pattern({dst, bytes}, seed);
    }
    if (device_) comm::cuda_copy_to_device(ptr_, tmp.data(), bytes);
  }
  std::uint64_t count_wrong(std::size_t bytes, std::uint64_t seed) {
    std::vector<std::uint8_t> tmp;
    const std::uint8_t* got = host_.data();
    if (device_) {
      tmp.resize(bytes);
      comm::cuda_copy_to_host(tmp.data(), ptr_, bytes);
      got = tmp.data();
    }
    return launcher::count_wrong({got, bytes}, seed);
  }

 private:
  std::size_t bytes_;
  bool device_;
  std::vector<std::uint8_t> host_;
  void* ptr_ = nullptr;
};

struct Backend {
  std::string name;
  bool device = false;
  std::function<void(void*, std::size_t, int)> run;
  // Where the root's bytes must be (colocate-arena: inside its segment); null: the bench's buffer.
  void* root_buffer = nullptr;
};

struct Row {
  double time_us = 0;
  std::uint64_t wrong = 0;
};

// Times `iters` back-to-back broadcasts (as nccl-tests does) and reports the slowest rank's mean.
Row measure(const Backend& b, BenchBuffer& buf, std::size_t bytes, const BroadcastBenchOptions& o,
            int rank, std::uint64_t seed) {
  void* const data = rank == o.root && b.root_buffer != nullptr ? b.root_buffer : buf.data();
  for (int i = 0; i < o.warmup; ++i) b.run(data, bytes, o.root);
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) b.run(data, bytes, o.root);
  double local_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      o.iters;
  double max_us = 0;
  MPI_Reduce(&local_us, &max_us, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  // Correctness pass: fresh random data from the root, receivers poisoned first.
  buf.fill(bytes, seed, rank != o.root);
  if (data != buf.data()) std::memcpy(data, buf.data(), bytes);  // untimed: the root's bytes
  MPI_Barrier(MPI_COMM_WORLD);
  b.run(data, bytes, o.root);
  unsigned long long wrong = rank == o.root ? 0 : buf.count_wrong(bytes, seed);
  unsigned long long total_wrong = 0;
  MPI_Reduce(&wrong, &total_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  return Row{max_us, total_wrong};
}

std::string detail_header(const BroadcastBenchOptions& o, int size) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "weightcast-bench broadcast: %d ranks, root %d, warmup %d, iters %d, chunk %s x %d "
                "in flight, loopback%s",
                size, o.root, o.warmup, o.iters, format_bytes(o.chunk_bytes).c_str(),
                o.chunks_in_flight,
                o.mpi_tcp_rows_in.empty()
                    ? ""
                    : "; mpi-bcast-shm: Open MPI over shared memory (btl vader) in this job, "
                      "mpi-bcast: over TCP (btl tcp) in a job just before it");
  return buf;
}

std::shared_ptr<comm::Store> connect_store(const BroadcastBenchOptions& o, int rank,
                                           std::unique_ptr<comm::TcpStoreServer>& server) {
  char addr[256] = {};
  if (rank == 0) {
    comm::TcpStoreServerOptions so;
    so.bind_address = o.bind_address;
    server = std::make_unique<comm::TcpStoreServer>(so);
    std::snprintf(addr, sizeof(addr), "%u", static_cast<unsigned>(server->port()));
  }
  MPI_Bcast(addr, sizeof(addr), MPI_CHAR, 0, MPI_COMM_WORLD);
  comm::TcpStoreOptions co;
  co.host = o.bind_address;
  co.port = static_cast<std::uint16_t>(std::stoul(addr));
  co.connect_timeout = Millis(o.timeout_ms);
  return std::make_shared<comm::PrefixStore>("bench", std::make_shared<comm::TcpStore>(co));
}

comm::CommOptions comm_options(const BroadcastBenchOptions& o, std::shared_ptr<comm::Store> store,
                               int rank, int size) {
  comm::CommOptions co = comm::member_options(std::move(store), rank, size, Millis(o.timeout_ms));
  co.gloo.bind_address = o.bind_address;
  co.gloo.chain.chunk_bytes = o.chunk_bytes;
  co.gloo.chain.chunks_in_flight = o.chunks_in_flight;
  co.gloo.eager_ring.max_bytes = o.eager_max_bytes;
  co.gloo.single_copy.min_bytes = o.single_copy_min_bytes;
  return co;
}

// gloo-chain or gloo-stock, on `gloo` (created on first use: both share one communicator).
Backend gloo_backend(const std::string& name, std::shared_ptr<comm::GlooCommunicator>& gloo,
                     const comm::CommOptions& co) {
  if (!gloo) gloo = comm::create_gloo_communicator(co);
  bool stock = name == "gloo-stock";
  return {name, false, [g = gloo, stock](void* p, std::size_t n, int root) {
            BroadcastOptions b{p, n, root, comm::MemoryKind::kHost, {}, {}};
            stock ? g->broadcast_stock(b) : g->broadcast(b);
          }};
}

// Which transport carries gloo-chain's small broadcasts, so a table can be read without guessing.
void print_eager_path(const comm::GlooCommunicator& gloo, const comm::CommOptions& co) {
  if (co.gloo.eager_ring.max_bytes == 0) {
    std::printf("# gloo-chain: eager ring off, every size over Gloo\n");
  } else if (gloo.single_copy()) {
    std::printf(
        "# gloo-chain: single copy from %zu bytes, any size (all ranks on one host); smaller "
        "broadcasts on the eager ring's sockets\n",
        co.gloo.single_copy.min_bytes);
  } else {
    std::printf(
        "# gloo-chain: up to %zu bytes on the eager ring's sockets (single copy off or "
        "not possible)\n",
        co.gloo.eager_ring.max_bytes);
  }
}

Backend mpi_backend(const std::string& name) {
  return {name, false, [](void* p, std::size_t n, int root) {
            // MPI counts are int: large buffers go in <2 GiB pieces.
            auto* c = static_cast<char*>(p);
            for (std::size_t off = 0; off < n; off += (1u << 30)) {
              int len = static_cast<int>(std::min<std::size_t>(1u << 30, n - off));
              MPI_Bcast(c + off, len, MPI_BYTE, root, MPI_COMM_WORLD);
            }
          }};
}

// Empty (rank 0 says why) when there are fewer CUDA devices than ranks.
std::optional<Backend> nccl_backend(const std::string& name, const comm::CommOptions& co, int rank,
                                    int size) {
  std::string why;
  int devices = comm::cuda_device_count(&why);
  if (devices < size) {
    if (rank == 0) {
      std::printf("# nccl: skipped (needs %d CUDA devices, found %d: %s)\n", size, devices,
                  why.c_str());
    }
    return std::nullopt;
  }
  auto nco = co;
  nco.store = std::make_shared<comm::PrefixStore>("nccl", co.store);
  nco.nccl.cuda_device = rank % devices;
  std::shared_ptr<comm::Communicator> nccl = comm::create_communicator("nccl", nco);
  return Backend{name, true, [c = nccl](void* p, std::size_t n, int root) {
                   c->broadcast({p, n, root, comm::MemoryKind::kCuda, {}, {}});
                 }};
}

std::vector<Backend> make_backends(const BroadcastBenchOptions& o, const comm::CommOptions& co,
                                   int rank, int size) {
  // The TCP job of a two-transport run times MPI_Bcast alone.
  if (!o.mpi_tcp_rows_out.empty()) return {mpi_backend("mpi-bcast")};
  std::shared_ptr<comm::GlooCommunicator> gloo;
  // A variant of the chain, on a group of its own.
  auto variant = [&](const std::string& name, auto adjust) {
    auto vco = co;
    vco.store = std::make_shared<comm::PrefixStore>(name, co.store);
    adjust(vco);
    std::shared_ptr<comm::GlooCommunicator> own;
    return gloo_backend(name, own, vco);
  };
  std::vector<Backend> backends;
  for (const auto& name : o.backends) {
    if (name == "gloo-chain" || name == "gloo-stock") {
      backends.push_back(gloo_backend(name, gloo, co));
      if (rank == 0 && name == "gloo-chain") print_eager_path(*gloo, co);
    } else if (name == "gloo-unbound") {
      // The chain with its eager ring off: every size over Gloo unbound buffers.
      backends.push_back(variant(name, [](auto& v) { v.gloo.eager_ring.max_bytes = 0; }));
    } else if (name == "gloo-sockets") {
      // The chain with single copy off: eager sizes through the ring's sockets.
      backends.push_back(variant(name, [](auto& v) { v.gloo.single_copy.enabled = false; }));
    } else if (name == "mpi-bcast") {
      // Beside the rows of the TCP job, this job's own MPI_Bcast runs over shared memory.
      backends.push_back(mpi_backend(o.mpi_tcp_rows_in.empty() ? name : "mpi-bcast-shm"));
    } else if (const auto colocated = colocated_backend_options(name)) {
      // The colocated path's segment: one write by the root, one read by every other rank, or the
      // route's parts (colocate_backend.h).
      auto c = colocated_broadcast(rank, size, o.max_bytes, Millis(o.timeout_ms), *colocated);
      backends.push_back({name, false, std::move(c.run), c.root_buffer});
    } else if (name == "nccl") {
      if (auto b = nccl_backend(name, co, rank, size)) backends.push_back(std::move(*b));
    } else {
      throw comm::ConfigError("unknown bench backend '" + name +
                              "' (gloo-chain, gloo-unbound, gloo-sockets, gloo-stock, mpi-bcast, "
                              "colocate, colocate-hash, colocate-arena, colocate-arena-hash, "
                              "colocate-arena-map-hash, nccl)");
    }
  }
  return backends;
}

BenchTable broadcast_table() {
  return BenchTable("broadcast",
                    {{"size(B)", 12, 0},
                     {"backend", 11, 0},
                     {"time(us)", 12, 1},
                     {"algbw(GB/s)", 12, 3},
                     {"busbw(GB/s)", 12, 3}},
                    /*wrong_width=*/8);
}

// The MPI_Bcast-over-TCP rows of the job before this one, by size (read on rank 0; the file is
// removed).
std::map<std::uint64_t, Row> read_tcp_rows(const std::string& path) {
  std::map<std::uint64_t, Row> rows;
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("cannot read the MPI_Bcast-over-TCP rows " + path);
  unsigned long long bytes = 0, wrong = 0;
  double us = 0;
  while (std::fscanf(f, "%llu %lf %llu", &bytes, &us, &wrong) == 3) rows[bytes] = Row{us, wrong};
  std::fclose(f);
  std::remove(path.c_str());
  return rows;
}

// Every size from --min-bytes to --max-bytes on every backend, a row each on rank 0 (and the TCP
// job's MPI_Bcast row of the same size, when there is one).
void sweep(const BroadcastBenchOptions& o, const std::vector<Backend>& backends, int rank,
           BenchTable& table) {
  std::unique_ptr<BenchBuffer> host_buf, dev_buf;
  std::map<std::uint64_t, Row> tcp;
  if (rank == 0 && !o.mpi_tcp_rows_in.empty()) tcp = read_tcp_rows(o.mpi_tcp_rows_in);
  std::uint64_t seed = 1;
  for (std::uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    auto add = [&](const std::string& name, const Row& row) {
      const double algbw = static_cast<double>(bytes) / (row.time_us * 1e3);
      table.add({bytes, name, row.time_us, algbw, algbw}, row.wrong);
    };
    for (const auto& b : backends) {
      auto& buf = b.device ? dev_buf : host_buf;
      if (!buf) buf = std::make_unique<BenchBuffer>(o.max_bytes, b.device);
      Row row = measure(b, *buf, bytes, o, rank, seed++);
      if (rank == 0) add(b.name, row);
    }
    if (rank == 0 && tcp.count(bytes)) add("mpi-bcast", tcp[bytes]);
    if (bytes > o.max_bytes / o.factor) break;
  }
}

}  // namespace

int run_broadcast_bench(const BroadcastBenchOptions& o) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  WC_ENFORCE_LT(o.root, size, "--root must name a rank");

  std::unique_ptr<comm::TcpStoreServer> server;
  auto store = connect_store(o, rank, server);
  const std::vector<Backend> backends =
      make_backends(o, comm_options(o, store, rank, size), rank, size);

  BenchTable table = broadcast_table();
  if (rank == 0) {
    table.note(detail_header(o, size));
    table.begin("busbw = algbw for broadcast (docs/performance.md)");
  }
  sweep(o, backends, rank, table);
  const std::uint64_t total_wrong = table.wrong();  // rank 0 holds the rows
  if (rank == 0 && !o.mpi_tcp_rows_out.empty()) {
    // The TCP job: its rows go to the main job, which prints them (wrong bytes fail this job).
    std::string text;
    for (const auto& row : table.rows()) {
      char line[96];
      std::snprintf(line, sizeof(line), "%llu %.3f 0\n",
                    static_cast<unsigned long long>(std::get<std::uint64_t>(row[0])),
                    std::get<double>(row[2]));
      text += line;
    }
    std::FILE* f = std::fopen(o.mpi_tcp_rows_out.c_str(), "w");
    const bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f != nullptr) std::fclose(f);
    if (!ok) throw std::runtime_error("cannot write " + o.mpi_tcp_rows_out);
  } else if (rank == 0) {
    std::vector<std::string> names;
    for (const auto& b : backends) names.push_back(b.name);
    if (!o.mpi_tcp_rows_in.empty()) names.push_back("mpi-bcast");
    summarize_broadcast(table, names, table.wrong());
    table.write(o.output);
  }
  unsigned long long all_wrong = total_wrong;
  MPI_Bcast(&all_wrong, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return all_wrong == 0 ? 0 : 1;
}

}  // namespace weightcast::launcher

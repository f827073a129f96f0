// weightcast-bench broadcast: an nccl-tests-style table of broadcast bandwidth for our pipelined
// Gloo chain and, in the same run, the peers a user would pick instead (stock gloo::broadcast,
// Open MPI's MPI_Bcast, NCCL when built and a GPU is present). Runs on every rank of an MPI job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/bench/table.h"

namespace weightcast::launcher {

struct BroadcastBenchOptions {
  std::vector<std::string> backends;  // gloo-chain, gloo-stock, mpi-bcast, nccl
  std::uint64_t min_bytes = 1u << 20;
  std::uint64_t max_bytes = 1u << 30;
  int factor = 2;
  int warmup = 2;
  int iters = 5;
  int root = 0;
  std::uint64_t chunk_bytes = 4u << 20;
  int chunks_in_flight = 4;
  std::uint64_t eager_max_bytes = 16u << 20;  // gloo-chain: the eager ring's threshold (0: off)
  std::uint64_t single_copy_min_bytes = 128u << 10;  // gloo-chain: single copy from this size
  std::string bind_address = "127.0.0.1";
  int timeout_ms = 120000;
  BenchOutput output;  // --csv / --json
  // MPI_Bcast over both of Open MPI's transports in one run (launcher/bench/main.cc starts two
  // jobs): the TCP job times mpi-bcast alone and writes "bytes time_us wrong" lines to
  // `mpi_tcp_rows_out`; the shared-memory job names its own MPI_Bcast mpi-bcast-shm, reads those
  // rows from `mpi_tcp_rows_in` (and removes the file) and shows them as mpi-bcast beside its own.
  std::string mpi_tcp_rows_out;
  std::string mpi_tcp_rows_in;
};

// Returns the process exit code (0 when every row had 0 wrong bytes).
int run_broadcast_bench(const BroadcastBenchOptions& opts);

}  // namespace weightcast::launcher

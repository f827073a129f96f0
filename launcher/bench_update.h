// weightcast-bench update: the end-to-end weight update (pause -> ... -> continue) of a model of a
// given size to E engine processes over loopback, and, in the same run, the raw gloo-chain
// broadcast of the same bytes as one buffer between the same number of processes, for the ratio.
// Also reports the peak RSS of the source and of every engine against the memory budget.
#pragma once

#include <cstdint>
#include <string>

namespace weightcast::launcher {

struct UpdateBenchOptions {
  int engines = 2;
  int ranks_per_engine = 1;
  std::uint64_t model_bytes = 1u << 30;
  std::uint64_t bucket_bytes = 256u << 20;
  int iters = 3;
  int max_in_flight = 3;  // unanswered bucket requests per engine
  std::uint64_t chunk_bytes = 4u << 20;
  int timeout_ms = 600000;
};

// `self_exe` locates the engine binary (../launcher/engine/weightcast-engine next to the bench)
// and re-runs the bench as raw-broadcast workers.
int run_update_bench(const UpdateBenchOptions& opts, const std::string& self_exe);

}  // namespace weightcast::launcher

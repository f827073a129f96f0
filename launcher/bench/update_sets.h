// The update bench's engine sets: engines on loopback, the updater that feeds each set, what the
// engines hold afterwards, the raw chain broadcast it is compared with, and the memory notes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launcher/bench/table.h"
#include "launcher/bench/update.h"
#include "launcher/child_process.h"
#include "sync/model/model.h"
#include "sync/trainer/tensor_arena.h"
#include "sync/trainer/updater.h"

namespace weightcast::launcher {

// The raw data plane: one gloo-chain broadcast of `bytes` from a source to `receivers` processes
// (bench hosts-worker on loopback), seconds per broadcast.
double raw_chain_seconds(const UpdateBenchOptions& o, const std::string& self, std::uint64_t bytes,
                         int receivers);

// Engines on loopback, each reporting its URL.
struct LocalEngines {
  std::vector<std::unique_ptr<ChildProcess>> processes;
  std::vector<std::string> urls;
};

LocalEngines start_engines(const UpdateBenchOptions& o, const std::string& self,
                           const std::string& spec_path, std::uint64_t model_bytes);

// Tensors of the target runner whose digest on the engine differs from the digest of what was
// sent (or that the engine lacks), summed over engines. Not timed.
std::uint64_t wrong_tensors(const std::vector<std::string>& urls,
                            const std::vector<sync::TensorMeta>& metas,
                            const sync::trainer::TensorArena& storage,
                            std::chrono::milliseconds timeout);

sync::trainer::UpdaterOptions updater_options(const UpdateBenchOptions& o);

// The peak RSS and CPU of every engine and of the source, against their memory budgets.
void note_memory(BenchTable& table, const std::vector<pid_t>& engines, std::uint64_t model,
                 std::uint64_t bucket);

// One engine set and the updater that feeds it: "full" (--delta off), "auto" or "on".
struct UpdateSet {
  std::string mode;
  LocalEngines local;
  std::vector<std::string> urls;
  std::unique_ptr<sync::trainer::DistributedUpdater> updater;
  double seconds = 0;  // summed over steps after the first
  std::uint64_t wire = 0;
  int ok = 0;
};

// The set under test, after a full ("off") set when comparing; each with its engines (started on
// loopback unless given) and its updater.
std::vector<UpdateSet> make_sets(const UpdateBenchOptions& o, const std::string& self,
                                 const std::string& spec_path, std::uint64_t model_bytes);

}  // namespace weightcast::launcher

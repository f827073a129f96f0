// weightcast-bench update: the end-to-end weight update (pause -> ... -> continue) of a model of a
// given size to E engine processes, and, in the same run, the raw gloo-chain broadcast of the
// same bytes as one buffer between the same number of processes, for the ratio. Every step's
// #wrong counts the target tensors whose digest on an engine differs from what was sent (a
// non-zero total makes the run fail). Also reports the peak RSS of the source and of every
// engine against the memory budget. The hosts mode reuses it with engines in network namespaces
// (engine_urls given, raw broadcast measured by the hosts mode itself).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "launcher/bench/engines.h"
#include "launcher/bench/table.h"
#include "sync/model/model.h"

namespace weightcast::launcher {

struct UpdateBenchOptions {
  int engines = 2;
  int ranks_per_engine = 1;
  std::uint64_t model_bytes = 1u << 30;
  // Model presets to run one after the other in this run, each with fresh engines (a mixture of
  // experts beside its dense twin: --models dense-1g,moe-1g); a last note compares their GB/s.
  // Empty: one Qwen-like model of about model_bytes.
  std::vector<std::string> models;
  // With models: the list is run this many times, every other round in reverse order (A B, B A,
  // A B, ...), so that a machine whose speed drifts during the run favours no model; the last note
  // gives each model's GB/s over the first model's, round by round and their median.
  int rounds = 1;
  std::uint64_t bucket_bytes = 256u << 20;
  int iters = 3;
  int max_in_flight = 3;  // unanswered bucket requests per engine
  std::uint64_t chunk_bytes = 4u << 20;
  int timeout_ms = 600000;
  // Empty: start `engines` engines on loopback. Else update these (already running) engines.
  std::vector<std::string> engine_urls;
  std::string bind_address = "127.0.0.1";  // the source's store and data-plane address
  bool raw = true;                         // also time the raw chain broadcast on loopback
  // SingleCopyOptions::enabled for the source and the raw chain: off keeps one host's processes on
  // sockets and Gloo, as if they were on different hosts (the engines need not be told: one
  // member off turns it off for the group).
  bool single_copy = true;
  // How weights change per step: "jump" (every element: the generator's step k) or "realistic"
  // (fp32 masters drift and are rounded: sync/model/drift.h).
  std::string drift = "jump";
  // Where the source's per-tensor digests are made: "write" (right after each tensor is written,
  // while it is in the cache, as weightcast-train's conversion does; NamedTensor::digest) or
  // "send" (the sender hashes every tensor again from memory during the update).
  std::string digest_at = "write";
  // The updater's delta mode (sync/trainer/delta_source.h): "auto", "on" or "off".
  std::string delta = "auto";
  // Also feed the same steps to a second engine set with delta "off", for delta-vs-full ratios.
  bool compare_full = false;
  std::string delta_codec = "xor_zstd";  // sync/model/delta.h
  // The updater's colocated path (sync/trainer/colocated_sender.h): "off", "on" or "auto".
  std::string colocate = "off";
  // Also feed the same steps to a second engine set on the chain (colocate "off") before the set
  // under test (colocate "on"), for colocated-vs-chain ratios; not with compare_full.
  bool compare_colocate = false;
  // Start the engines with --no-kept-mappings (docs/colocated.md, "Kept mappings").
  bool no_kept_mappings = false;
  // A new HTTP connection per engine request (UpdaterOptions::keep_alive off).
  bool no_keep_alive = false;
  // With compare_full and engine_urls: the engines of the full set (engine_urls: the other).
  std::vector<std::string> full_engine_urls;
  BenchOutput output;  // --csv / --json
};

// `self_exe` locates the engine binary (engine/weightcast-engine next to the bench) and re-runs
// the bench as raw-broadcast workers.
int run_update_bench(const UpdateBenchOptions& opts, const std::string& self_exe);

// An engine's argv for the update and hosts modes: the engine binary beside this bench, loading
// `spec_path`, with buckets and timeouts from `o`.
std::vector<std::string> update_engine_argv(const UpdateBenchOptions& o, const std::string& self,
                                            const std::string& spec_path, std::uint64_t model_bytes,
                                            const std::string& host);

}  // namespace weightcast::launcher

// weightcast-bench hosts: broadcast between separate "hosts" (network namespaces joined by a
// bridge, every host's link shaped with tc tbf), to show what the pipelined chain does on real
// links: each link carries the data once, so the chain runs near the link rate while stock
// gloo::broadcast divides the root's link by the number of receivers.
//
// Needs root (CAP_NET_ADMIN), `ip` and `tc`; where namespaces cannot be created it prints a
// skip line and returns 0. It always removes what it created, on success, failure or signal.
// Addresses come from 198.18.0.0/15, the range reserved for network benchmarks (RFC 2544).
#pragma once

#include <cstdint>
#include <string>

#include <vector>
#include "launcher/bench/table.h"

namespace weightcast::launcher {

struct HostsBenchOptions {
  int receivers = 4;
  std::string rate = "800mbit";
  std::uint64_t bytes = 64u << 20;
  int iters = 3;
  std::uint64_t chunk_bytes = 1u << 20;
  int chunks_in_flight = 4;
  int timeout_ms = 300000;
  // > 0: also the end-to-end update of a model of about this size from host 0 (the source) to an
  // engine in every receiving host, over the same links.
  std::uint64_t update_model_bytes = 0;
  std::uint64_t update_bucket_bytes = 64u << 20;
  // "realistic": the update runs drifted weights on two engine sets per host (full and delta
  // buckets, the same steps), for the delta-vs-full ratios on these links.
  std::string update_drift = "jump";
  // > 0: also weightcast-train's expert-parallel stage with this many EP ranks, one per host,
  // feeding `trainer_engines` engines in hosts of their own, once per --tp-gather mode
  // (launcher/bench/hosts_ep.h).
  int trainer_ep = 0;
  std::string trainer_model = "moe-small";
  std::uint64_t trainer_bucket_bytes = 8u << 20;
  int trainer_steps = 4;
  int trainer_engines = 2;
  std::vector<std::string> trainer_gathers = {"whole", "overlap"};  // --tp-gather modes, in order
  // Non-empty: also shard-aware broadcast against full broadcast, the receiving hosts being the
  // ranks of engines of each of these TP sizes (launcher/bench/hosts_shard.h), with host 0's link
  // at `shard_source_rate` (empty: `rate` times the largest TP size) and buckets of
  // `shard_bucket_bytes`.
  std::vector<int> shard_tps;
  std::string shard_source_rate;
  std::uint64_t shard_bucket_bytes = 8u << 20;
  // Non-empty: also the whole update, sliced against full, against torch reference engines of each
  // of these TP sizes whose workers are the receiving hosts (launcher/bench/hosts_shard_update.h):
  // that model, steps per run, and the interpreter that imports torch and weightcast.
  std::vector<int> shard_update_tps;
  std::string shard_update_model = "small";
  int shard_update_steps = 4;
  std::string python = "python3";
  BenchOutput output;  // --csv / --json
};

int run_hosts_bench(const HostsBenchOptions& opts, const std::string& self_exe);

// One host's process (started by run_hosts_bench inside its namespace).
struct HostsWorkerOptions {
  int rank = 0;
  int size = 0;
  std::string bind_address;
  std::string store_host;
  int store_port = 0;  // rank 0 hosts the store and prints "store-port N"
  std::uint64_t bytes = 0;
  int iters = 3;
  std::uint64_t chunk_bytes = 1u << 20;
  int chunks_in_flight = 4;
  int timeout_ms = 300000;
  std::vector<std::string> backends = {"gloo-chain", "gloo-stock"};
  bool single_copy = true;  // SingleCopyOptions::enabled (ranks of one host and namespace only)
  // Non-empty: the sharded broadcast (launcher/bench/hosts_shard.h) instead of the backends.
  std::vector<int> shard_tps;
  std::uint64_t bucket_bytes = 8u << 20;
};

int run_hosts_worker(const HostsWorkerOptions& opts);

// The command line that starts `self` (weightcast-bench) as the hosts worker `w` describes: the
// one place that mirrors the hosts-worker flags (launcher/bench/main.cc parses them back).
std::vector<std::string> hosts_worker_argv(const std::string& self, const HostsWorkerOptions& w);

}  // namespace weightcast::launcher

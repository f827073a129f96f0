// Wiring for weightcast-engine: the parsed command line, turned into runners and engine options.
// Argument parsing and wiring only; the logic lives in sync/engine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sync/engine/control/engine.h"
#include "sync/engine/http/server.h"

namespace weightcast::launcher {

struct RunnerArgs {
  std::string filter;
  std::string layout = "none";
  std::string safetensors;  // empty: generate from --model and --seed
};

struct EngineArgs {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string token;
  int ranks = 1;
  bool draft = false;
  RunnerArgs target{"model.*,lm_head.*", "none", ""};
  RunnerArgs draft_runner{"mtp.*", "none", ""};
  std::string model = "tiny";  // preset name, or a path to an HF-style config.json
  std::uint64_t seed = 0;
  std::string weight_version = "default";
  bool legacy_finalize = false;
  bool no_colocate = false;                 // EngineOptions::colocate off
  bool no_kept_mappings = false;            // EngineOptions::keep_segment_mappings off
  std::vector<std::string> frozen_runners;  // never touched by a sessionless update
  bool sessionless_updates_frozen = false;  // ... unless this is set
  std::int64_t lease_ttl_s = 300;           // a trainer's lease when its begin names none
  std::string speculative_algorithm;        // empty: "EAGLE" when a draft is held, else none
  std::int64_t init_timeout_ms = 60000;
  std::int64_t comm_timeout_ms = 60000;
  std::int64_t session_timeout_ms = 60000;
  std::int64_t http_timeout_ms = 30000;
  std::string max_bucket_bytes = "4G";
  std::string max_body_bytes = "64M";
  std::string max_file_bytes = "64G";
  int http_threads = 32;
  int max_buckets_ahead = 8;
  std::string comm_address;  // empty: --host
  std::string store_token;
  std::string chunk_bytes = "4M";
  bool single_copy = true;  // Gloo: same-host single copy (comm::SingleCopyOptions::enabled)
  bool allow_same_user_reads = false;  // comm::SingleCopyOptions::allow_same_user_reads
  int base_gpu_id = 0;                 // NCCL: engine rank i uses CUDA device base_gpu_id + i
  int ep_size = 1;                     // expert parallelism over the engine's ranks
  std::string expert_placement = "linear";
  std::string shard_plan = "none";  // none or tensor-parallel (docs/sharding.md)
};

// Builds the runners (generating or loading their weights); throws comm::ConfigError.
std::unique_ptr<sync::engine::RunnerSet> make_runners(const EngineArgs& args);
sync::engine::EngineOptions make_engine_options(const EngineArgs& args);
// Each rank's shard plan for --shard-plan (none: empty), by the hand-written tensor-parallel
// rules (sync/model/tensor_parallel_plan.h) over the runners' tensors; comm::ConfigError for a
// model the rules cannot divide over --ranks.
std::vector<sync::ShardPlan> make_shard_plans(const EngineArgs& args);
sync::engine::ServerOptions make_server_options(const EngineArgs& args);
// Whether `host` is a loopback address or name (127.0.0.0/8, ::1, localhost): only then is an
// engine without --token reachable by local clients alone.
bool loopback_host(const std::string& host);

}  // namespace weightcast::launcher

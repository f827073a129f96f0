#include "launcher/engine/engine_setup.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "launcher/cli_util.h"
#include "sync/engine/runners/weights.h"
#include "sync/model/model.h"
#include "sync/model/tensor_parallel_plan.h"

namespace weightcast::launcher {

namespace {

using namespace weightcast::sync;
using namespace weightcast::sync::engine;

ModelSpec load_model(const std::string& model) {
  for (auto name : model_preset_names()) {
    if (name == model) return model_preset(model);
  }
  std::ifstream in(model);
  if (!in) {
    std::string names;
    for (auto name : model_preset_names()) names += (names.empty() ? "" : ", ") + std::string(name);
    throw comm::ConfigError("--model: '" + model + "' is neither a preset (" + names +
                            ") nor a readable config.json");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw comm::ConfigError("--model: '" + model + "' is not JSON: " + e.what());
  }
  return model_spec_from_json(j);
}

std::size_t bytes_arg(const std::string& text, const char* flag) {
  try {
    return static_cast<std::size_t>(parse_bytes(text));
  } catch (const std::exception& e) {
    throw comm::ConfigError(std::string(flag) + ": " + e.what());
  }
}

RunnerConfig runner_config(Runner id, const RunnerArgs& r, const EngineArgs& args,
                           const ModelSpec& spec) {
  RunnerConfig config;
  config.id = id;
  const std::string flag = "--" + std::string(to_string(id));
  try {
    config.filter = NameFilter::parse(r.filter, flag + "-filter");
    config.layout = parse_layout(r.layout);
  } catch (const comm::BadRequestError& e) {
    throw comm::ConfigError(flag + ": " + e.what());
  }
  if (r.safetensors.empty()) {
    config.model = to_json(spec);
    config.seed = args.seed;
    config.source = "generated";
  } else {
    config.model = nullptr;
    config.source = "safetensors";
  }
  return config;
}

}  // namespace

std::unique_ptr<RunnerSet> make_runners(const EngineArgs& args) {
  const ModelSpec spec = load_model(args.model);
  std::vector<std::pair<RunnerConfig, const RunnerArgs*>> held;
  held.emplace_back(runner_config(Runner::kTarget, args.target, args, spec), &args.target);
  if (args.draft) {
    held.emplace_back(runner_config(Runner::kDraft, args.draft_runner, args, spec),
                      &args.draft_runner);
  }
  std::vector<RunnerConfig> configs;
  for (const auto& [config, r] : held) configs.push_back(config);
  auto runners = std::make_unique<RunnerSet>(configs, args.weight_version, args.ranks);
  const std::size_t max_file = bytes_arg(args.max_file_bytes, "--max-file-bytes");
  for (const auto& [config, r] : held) {
    runners->load_initial(config.id,
                          r->safetensors.empty()
                              ? generate_weights(runner_tensors(config.id, spec), args.seed)
                              : load_safetensors(r->safetensors, max_file));
  }
  return runners;
}

EngineOptions make_engine_options(const EngineArgs& args) {
  EngineOptions o;
  o.rank_count = args.ranks;
  o.legacy_finalize = args.legacy_finalize;
  o.colocate = !args.no_colocate;
  o.keep_segment_mappings = !args.no_kept_mappings;
  o.init_timeout = comm::Millis(args.init_timeout_ms);
  o.comm_timeout = comm::Millis(args.comm_timeout_ms);
  o.session_timeout = comm::Millis(args.session_timeout_ms);
  o.max_bucket_bytes = bytes_arg(args.max_bucket_bytes, "--max-bucket-bytes");
  o.max_buckets_ahead = static_cast<std::uint64_t>(args.max_buckets_ahead);
  o.connect.bind_address = args.comm_address.empty() ? args.host : args.comm_address;
  o.connect.store_token = args.store_token;
  o.connect.chunk_bytes = bytes_arg(args.chunk_bytes, "--chunk-bytes");
  o.connect.single_copy = args.single_copy;
  o.connect.allow_same_user_reads = args.allow_same_user_reads;
  if (args.base_gpu_id < 0) {
    throw comm::ConfigError("--base-gpu-id must be >= 0 (got " + std::to_string(args.base_gpu_id) +
                            ")");
  }
  o.connect.base_gpu_id = args.base_gpu_id;
  if (!args.speculative_algorithm.empty()) {
    o.speculative_algorithm = args.speculative_algorithm;
  } else if (args.draft) {
    o.speculative_algorithm = "EAGLE";
  }
  o.limits.max_body_bytes = bytes_arg(args.max_body_bytes, "--max-body-bytes");
  o.limits.max_bucket_bytes = o.max_bucket_bytes;
  for (const std::string& name : args.frozen_runners) {
    const Runner id = parse_runner(name);
    if (id == Runner::kDraft && !args.draft) {
      throw comm::ConfigError("--frozen-runner draft: this engine holds no draft (add --draft)");
    }
    o.sessionless.frozen.insert(id);
  }
  o.sessionless.touch_frozen = args.sessionless_updates_frozen;
  o.lease_ttl = comm::Millis(args.lease_ttl_s * 1000);
  if (args.ep_size != 1) {
    const ModelSpec spec = load_model(args.model);
    if (!spec.is_moe()) {
      throw comm::ConfigError("--ep-size " + std::to_string(args.ep_size) + ": model '" +
                              args.model + "' has no routed experts");
    }
    if (args.ep_size < 1 || args.ranks % args.ep_size != 0) {
      throw comm::ConfigError("--ep-size must divide --ranks (got " + std::to_string(args.ep_size) +
                              " with " + std::to_string(args.ranks) + " ranks)");
    }
    o.experts.ep_size = args.ep_size;
    o.experts.num_experts = static_cast<int>(spec.num_experts);
    o.experts.strategy = parse_placement_strategy(args.expert_placement);
  }
  o.shard_plans = make_shard_plans(args);
  return o;
}

std::vector<ShardPlan> make_shard_plans(const EngineArgs& args) {
  if (args.shard_plan == "none") return {};
  if (args.shard_plan != "tensor-parallel") {
    throw comm::ConfigError("--shard-plan: none or tensor-parallel (got '" + args.shard_plan +
                            "')");
  }
  if (!args.target.safetensors.empty() || !args.draft_runner.safetensors.empty()) {
    throw comm::ConfigError(
        "--shard-plan tensor-parallel derives each rank's plan from --model's tensors; it does "
        "not read weights files (drop --target-safetensors/--draft-safetensors or the plan)");
  }
  const ModelSpec spec = load_model(args.model);
  std::vector<TensorMeta> tensors = runner_tensors(Runner::kTarget, spec);
  if (args.draft) {
    for (auto& meta : runner_tensors(Runner::kDraft, spec)) tensors.push_back(std::move(meta));
  }
  ParallelRank rank{.tp_size = args.ranks, .tp_rank = 0, .ep_size = args.ep_size};
  rank.placement = parse_placement_strategy(args.expert_placement);
  std::vector<ShardPlan> plans;
  for (rank.tp_rank = 0; rank.tp_rank < args.ranks; ++rank.tp_rank) {
    plans.push_back(tensor_parallel_plan(spec, tensors, rank));
  }
  try {
    validate_shard_plans(tensors, plans);
  } catch (const comm::BadRequestError& e) {
    throw comm::ConfigError(std::string("--shard-plan tensor-parallel: ") + e.what());
  }
  return plans;
}

bool loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

ServerOptions make_server_options(const EngineArgs& args) {
  ServerOptions s;
  s.host = args.host;
  s.port = args.port;
  s.token = args.token;
  s.max_body_bytes = bytes_arg(args.max_body_bytes, "--max-body-bytes");
  s.read_timeout = comm::Millis(args.http_timeout_ms);
  s.write_timeout = comm::Millis(args.http_timeout_ms);
  s.threads = args.http_threads;
  return s;
}

}  // namespace weightcast::launcher

#include "launcher/train/train_options.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "launcher/cli_options.h"
#include "launcher/cli_util.h"
#include "sync/model/bucket.h"
#include "sync/protocol/protocol_enums.h"

namespace weightcast::launcher::train {

namespace {

// The trainer's parallel layout and the engines it updates.
void add_parallelism_options(CLI::App& app, TrainOptions& o) {
  ranged(app, "--tp", o.tp, "tensor-parallel size", 1, 1024);
  ranged(app, "--pp", o.pp, "pipeline-parallel size (one group per stage)", 1, 1024);
  ranged(app, "--ep", o.ep,
         "expert-parallel size: the first N data-parallel replicas of each stage split the "
         "experts (N must divide the data-parallel size and the number of experts)",
         1, 1024);
  one_of(app, "--expert-layout", o.expert_layout,
         "Megatron's expert parameters: local (local_experts.{i}.linear_fc1) or grouped "
         "(TE grouped GEMM: linear_fc1.weight{i})",
         {"local", "grouped"});
  app.add_option("--engines", o.engines, "engine URLs, comma separated (order fixes rank offsets)")
      ->delimiter(',')
      ->required();
}

// The model: a preset or config.json, per-field overrides, the generator seed.
void add_model_options(CLI::App& app, TrainOptions& o) {
  with_default(
      app, "--model", o.model,
      "model preset (tiny, small, qwen3-0.6b, qwen3-8b, moe-tiny, moe-small, moe-1g, dense-1g, "
      "deepseek-tiny) or an HF config.json path");
  app.add_option("--vocab-size", o.vocab_size, "override vocab_size");
  app.add_option("--hidden-size", o.hidden_size, "override hidden_size");
  app.add_option("--num-layers", o.num_layers, "override num_hidden_layers");
  app.add_option("--num-heads", o.num_heads, "override num_attention_heads");
  app.add_option("--num-kv-heads", o.num_kv_heads, "override num_key_value_heads");
  app.add_option("--head-dim", o.head_dim, "override head_dim");
  app.add_option("--intermediate-size", o.intermediate_size, "override intermediate_size");
  app.add_option("--mtp-layers", o.mtp_layers, "override num_nextn_predict_layers (trained MTP)");
  app.add_option("--dtype", o.dtype, "override torch_dtype (bfloat16, float32, ...)");
  with_default(app, "--seed", o.seed, "generator seed; engines must start from the same");
}

// How many updates, how they are bucketed and sent, and the credentials they carry.
void add_transfer_options(CLI::App& app, TrainOptions& o) {
  ranged(app, "--steps", o.steps, "training steps, one weight update each", 1, 1000000);
  with_default(app, "--bucket-bytes", o.bucket_bytes, "largest bucket (K/M/G suffixes)");
  one_of(app, "--atomic-groups", o.atomic_groups,
         "tensors an engine loads together stay in one bucket: auto (fused q/k/v, gate/up and "
         "MLA down projections for MoE and MLA models, none for dense ones), fused (those for "
         "every model), experts (also each expert's three matrices), off",
         {"auto", "fused", "experts", "off"});
  ranged(app, "--max-in-flight", o.max_in_flight, "unanswered bucket requests per engine", 1, 64);
  one_of(app, "--backend", o.backend, "data plane: gloo (host) or nccl (CUDA)", {"gloo", "nccl"});
  one_of(app, "--colocate", o.colocate,
         "the colocated path for engines on this host (weightcast-engine, the torch reference "
         "engine; docs/colocated.md): auto (with --backend gloo): they copy each bucket out of "
         "shared memory while the others take the chain, in one update; on: also with nccl, and "
         "an error when no engine offers it; off: every engine on the chain. The step line's "
         "path says which ran",
         {"off", "on", "auto"});
  one_of(app, "--colocate-memory", o.colocate_memory,
         "where colocated buckets lie: host (sealed memfd segments) or cuda (device segments on "
         "--cuda-device, handed to engines as CUDA IPC handles; needs a GPU)",
         {"host", "cuda"});
  ranged(app, "--cuda-device", o.cuda_device,
         "nccl, and --colocate-memory cuda: the CUDA device of each stage source (-1: the "
         "current one); a trainer "
         "and an engine on one machine each take their own (the engine's --base-gpu-id)",
         -1, 1023);
  app.add_option("--token", o.token, "bearer token of the engines' routes");
  app.add_option("--store-token", o.store_token,
                 "token of the stage sources' rendezvous stores (engines: --store-token)");
}

// What each update covers and how it is checked afterwards.
void add_selection_options(CLI::App& app, TrainOptions& o) {
  one_of(app, "--selector", o.selector,
         "session scope: auto (the decision function), all, target or draft",
         {"auto", "all", "target", "draft"});
  app.add_option("--speculative-algorithm", o.speculative_algorithm,
                 "for --selector auto; default: what the engines report");
  one_of(app, "--conversion", o.conversion, "weight conversion mode: raw or bridge",
         {"raw", "bridge"});
  app.add_flag("--verify", o.verify, "check every engine's runner digests after each update");
  app.add_flag("--keep-going", o.keep_going,
               "with --verify: run every step even after a mismatch (exit 1 at the end)");
  app.add_flag("--probe-accept-length", o.probe_accept_length,
               "after each update, report every engine's speculative accept length");
}

// How the engines are reached and spoken to.
void add_engine_options(CLI::App& app, TrainOptions& o) {
  with_default(app, "--group-prefix", o.group_prefix, "groups are <prefix>-pp_<stage>");
  with_default(app, "--bind-address", o.bind_address,
               "address of the stage sources' stores and data plane, as engines reach it");
  app.add_option("--engine-flavor", o.engine_flavor,
                 "engine dialect: auto (detected per engine from /server_info), weightcast, "
                 "sglang or vllm (vLLM's dev-mode routes: the weightcast weight-transfer "
                 "backend, or the weightcast worker extension through /collective_rpc)")
      ->check(CLI::IsMember({"auto", "weightcast", "sglang", "vllm"}));
  app.add_option("--common-format", o.common_format,
                 "how tensors travel when an SGLang engine is in the group: per_tensor or "
                 "flattened_bucket")
      ->check(CLI::IsMember({"per_tensor", "flattened_bucket"}));
  app.add_option("--torch-store", o.torch_store,
                 "generation of the torch store hosted for groups with SGLang engines: auto "
                 "(told by the first SGLang engine that connects), torch2 (current SGLang) or "
                 "torch1 (torch 1.x peers)")
      ->check(CLI::IsMember({"auto", "torch1", "torch2"}));
  one_of(app, "--pause-mode", o.pause_mode, "pause_generation mode",
         {"abort", "retract", "in_place"});
  ranged(app, "--flush-attempts", o.flush_attempts,
         "flush_cache is retried while it answers non-200 (SGLang: requests still hold the "
         "cache), this many times, --flush-retry-ms apart; skipped with --pause-mode in_place",
         1, 3600);
  ranged(app, "--flush-retry-ms", o.flush_retry_ms, "pause between two flush_cache attempts", 1,
         60000);
  app.add_option("--sglang-reload-path", o.sglang_reload_path,
                 "an SGLang engine left holding part of a failed update is reloaded from this "
                 "checkpoint (POST /update_weights_from_disk) before it resumes; without it, it "
                 "stays paused and is reported");
  app.add_flag("--allow-same-user-reads", o.allow_same_user_reads,
               "let processes of this user read this trainer's memory (PR_SET_PTRACER_ANY), so "
               "same-host single copy works under Yama ptrace_scope 1; the engines need "
               "--allow-same-user-reads too (docs/security.md)");
  ranged(app, "--lease-ttl-s", o.lease_ttl_s,
         "the lease this trainer holds on each weightcast engine outlives its last session by "
         "this long should the trainer vanish (0: the engine's --lease-ttl-s)",
         0, 86400);
}

// Deadlines, and the simulated slow link.
void add_timeout_options(CLI::App& app, TrainOptions& o) {
  with_default(app, "--connect-timeout-ms", o.connect_timeout_ms, "TCP connect to an engine");
  with_default(app, "--request-timeout-ms", o.request_timeout_ms, "answer of a control route");
  app.add_flag("--no-keep-alive", o.no_keep_alive,
               "a new HTTP connection for every engine request (by default one is reused within an "
               "update)");
  with_default(app, "--update-timeout-ms", o.update_timeout_ms, "one stage's data phase");
  with_default(app, "--group-timeout-ms", o.group_timeout_ms, "group setup and each collective");
  with_default(app, "--mpi-timeout-ms", o.mpi_timeout_ms, "waits between trainer ranks");
  with_default(app, "--bucket-delay-ms", o.bucket_delay_ms,
               "sleep after each bucket, to simulate a slow link (tests, demos)");
}

// What an engine failing an update does to the step, and how it is re-admitted.
void add_failure_options(CLI::App& app, TrainOptions& o) {
  one_of(app, "--on-engine-failure", o.on_engine_failure,
         "an engine failing an update: fail (the step fails) or drop (the engine leaves "
         "the set, the step completes on the others; it is probed and re-admitted)",
         {"fail", "drop"});
  with_default(app, "--probe-timeout-ms", o.probe_timeout_ms,
               "with drop: each /health probe of an engine");
  with_default(app, "--probe-backoff-max-steps", o.probe_backoff_max_steps,
               "with drop: most steps between two probes of an engine that keeps failing");
}

// The simulated training: time between steps, how weights drift, and delta updates.
void add_step_options(CLI::App& app, TrainOptions& o) {
  with_default(app, "--step-interval-ms", o.step_interval_ms,
               "time between updates, standing in for the training compute (tests, demos)");
  one_of(app, "--delta", o.delta,
         "auto: once every engine confirmed a version, send each bucket as a delta "
         "against it when that is expected to arrive sooner on this link (keeps one base "
         "copy per stage); on: whenever a delta is smaller; off: always in full",
         {"off", "auto", "on"});
  one_of(app, "--delta-codec", o.delta_codec, "delta payload codec",
         {"xor_zstd", "xor_lz4", "sparse"});
  one_of(app, "--shard", o.shard,
         "auto: engines that announce shard plans get only each rank's slice, one group per "
         "shard class (docs/sharding.md); off: every engine rank gets whole tensors",
         {"auto", "off"});
  one_of(app, "--drift", o.drift,
         "how weights change per step: jump (every element redrawn: the generator's "
         "step k) or realistic (fp32 masters moved by an optimizer-like step and rounded "
         "to the dtype; a few percent of elements change)",
         {"jump", "realistic"});
  app.add_option("--drift-lr", o.drift_lr, "realistic drift's step size (0: the default rate)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  one_of(app, "--tp-gather", o.tp_gather,
         "how a stage source gets its TP (and EP) ranks' shards: whole: gathered before the "
         "update opens (measured faster where the stage's ranks share a host's cores); "
         "overlap: in groups of about a bucket on a thread, each group's buckets broadcast "
         "while the next is gathered (measured faster where they span hosts: the gather uses "
         "the source's incoming link while the broadcast uses its outgoing one); auto: overlap "
         "when the stage spans hosts, else whole",
         {"auto", "whole", "overlap"});
}

// LoRA: adapters on a frozen base instead of the base weights (docs/lora.md).
void add_lora_options(CLI::App& app, TrainOptions& o) {
  ranged(app, "--lora-rank", o.lora_rank,
         "train (perturb) a LoRA adapter of this rank on the frozen base and send only it each "
         "step, swapped in under --lora-name on every engine; 0: send the base weights",
         0, 65536);
  app.add_option("--lora-alpha", o.lora_alpha,
                 "the adapter's lora_alpha (its scaling is alpha / rank); 0: twice the rank")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--lora-targets", o.lora_targets,
                 "modules the adapter adapts, comma separated (PEFT's target_modules)")
      ->delimiter(',')
      ->capture_default_str();
  with_default(app, "--lora-name", o.lora_name, "the adapter's name on the engines (lora_name)");
}

}  // namespace

std::optional<sync::LoraConfig> lora_config(const TrainOptions& o) {
  if (o.lora_rank == 0) return std::nullopt;
  nlohmann::json config = {{"r", o.lora_rank},
                           {"lora_alpha", o.lora_alpha > 0 ? o.lora_alpha : 2.0 * o.lora_rank},
                           {"target_modules", o.lora_targets}};
  try {
    sync::validate_adapter_name(o.lora_name, "--lora-name");
    return sync::parse_lora_config(config.dump());
  } catch (const comm::BadRequestError& e) {
    throw comm::ConfigError(std::string("--lora-*: ") + e.what());
  }
}

void add_options(CLI::App& app, TrainOptions& o) {
  add_parallelism_options(app, o);
  add_model_options(app, o);
  add_transfer_options(app, o);
  add_selection_options(app, o);
  add_engine_options(app, o);
  add_timeout_options(app, o);
  add_failure_options(app, o);
  add_step_options(app, o);
  add_lora_options(app, o);
}

sync::ModelSpec resolve_model(const TrainOptions& o) {
  sync::ModelSpec spec;
  bool preset = false;
  for (auto name : sync::model_preset_names()) preset = preset || name == o.model;
  if (preset) {
    spec = sync::model_preset(o.model);
  } else {
    std::ifstream in(o.model);
    if (!in) {
      throw comm::ConfigError("--model '" + o.model +
                              "' is neither a preset nor a readable config.json");
    }
    try {
      spec = sync::model_spec_from_json(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      throw comm::ConfigError("--model '" + o.model + "': " + e.what());
    }
  }
  if (o.vocab_size) spec.vocab_size = *o.vocab_size;
  if (o.hidden_size) spec.hidden_size = *o.hidden_size;
  if (o.num_layers) spec.num_layers = *o.num_layers;
  if (o.num_heads) spec.num_attention_heads = *o.num_heads;
  if (o.num_kv_heads) spec.num_key_value_heads = *o.num_kv_heads;
  if (o.head_dim) spec.head_dim = *o.head_dim;
  if (o.intermediate_size) spec.intermediate_size = *o.intermediate_size;
  if (o.mtp_layers) spec.mtp_num_layers = *o.mtp_layers;
  if (o.dtype) spec.dtype = sync::parse_dtype(*o.dtype);
  sync::validate(spec);
  return spec;
}

sync::trainer::ExpertParallel expert_parallel(const TrainOptions& o) {
  return {o.ep, sync::trainer::parse_expert_layout(o.expert_layout)};
}

std::optional<sync::GroupRule> atomic_group_rule(const TrainOptions& o,
                                                 const sync::ModelSpec& spec) {
  if (o.atomic_groups == "off") return std::nullopt;
  if (o.atomic_groups == "auto" && !spec.is_moe() && !spec.is_mla()) return std::nullopt;
  sync::GroupRule rule = sync::group_rule(spec);
  rule.whole_expert = o.atomic_groups == "experts";
  return rule;
}

void check_model_layout(const TrainOptions& o, const sync::ModelSpec& spec) {
  const auto experts = expert_parallel(o);
  const auto rule = atomic_group_rule(o, spec);
  const auto bucket_bytes = static_cast<std::size_t>(parse_bytes(o.bucket_bytes));
  for (int s = 0; s < o.pp; ++s) {
    const auto params = sync::trainer::stage_params(spec, s, o.pp, experts);
    sync::trainer::check_tp_divisible(params, o.tp);
    if (!rule || bucket_bytes == 0) continue;
    std::vector<sync::TensorMeta> metas;
    for (const auto& param : params)
      metas.insert(metas.end(), param.parts.begin(), param.parts.end());
    sync::plan_buckets(metas, bucket_bytes, sync::kDefaultBucketAlignment,
                       sync::atomic_groups(metas, *rule));
  }
}

sync::SelectorConfig selector_config(const TrainOptions& o, const sync::ModelSpec& spec,
                                     const std::optional<std::string>& engines_algorithm) {
  sync::SelectorConfig config;
  config.speculative_algorithm =
      o.speculative_algorithm ? o.speculative_algorithm : engines_algorithm;
  config.mtp_num_layers = static_cast<int>(spec.mtp_num_layers);
  config.conversion_mode = o.conversion;
  return config;
}

sync::trainer::UpdaterOptions updater_options(const TrainOptions& o,
                                              const sync::SelectorConfig& config) {
  using comm::Millis;
  sync::trainer::UpdaterOptions u;
  if (o.selector != "auto") u.selector = sync::parse_selector(o.selector);
  u.selector_config = config;
  u.backend = sync::parse_backend(o.backend);
  u.group_prefix = o.group_prefix;
  u.bind_address = o.bind_address;
  u.token = o.token;
  u.store_token = o.store_token;
  u.pause_mode = sync::parse_pause_mode(o.pause_mode);
  u.buckets.bucket_bytes = static_cast<std::size_t>(parse_bytes(o.bucket_bytes));
  if (u.buckets.bucket_bytes == 0) throw comm::ConfigError("--bucket-bytes must be positive");
  u.buckets.max_in_flight = static_cast<std::size_t>(o.max_in_flight);
  u.buckets.timeout = Millis(o.update_timeout_ms);
  u.buckets.bucket_delay = Millis(o.bucket_delay_ms);
  u.connect_timeout = Millis(o.connect_timeout_ms);
  u.request_timeout = Millis(o.request_timeout_ms);
  u.keep_alive = !o.no_keep_alive;
  u.group_timeout = Millis(o.group_timeout_ms);
  u.on_engine_failure = sync::trainer::parse_engine_failure_policy(o.on_engine_failure);
  u.delta = sync::trainer::parse_delta_mode(o.delta);
  u.shard = sync::trainer::parse_shard_mode(o.shard);
  u.colocate = sync::trainer::parse_colocate_mode(o.colocate);
  u.colocate_memory = sync::trainer::parse_colocate_memory(o.colocate_memory);
  u.cuda_device = o.cuda_device;
  u.delta_codec = sync::parse_delta_codec(o.delta_codec);
  u.probe_timeout = Millis(o.probe_timeout_ms);
  u.max_backoff_updates = o.probe_backoff_max_steps;
  if (o.engine_flavor != "auto")
    u.engine_flavor = sync::trainer::parse_engine_flavor(o.engine_flavor);
  u.common_load_format = o.common_format == "per_tensor" ? sync::LoadFormat::kPerTensor
                                                         : sync::LoadFormat::kFlattenedBucket;
  u.torch_protocol = o.torch_store == "torch1"   ? comm::C10dProtocol::kTorch1
                     : o.torch_store == "torch2" ? comm::C10dProtocol::kTorch2
                                                 : comm::C10dProtocol::kAuto;
  u.flush_attempts = o.flush_attempts;
  u.flush_retry = Millis(o.flush_retry_ms);
  u.sglang_reload_path = o.sglang_reload_path;
  u.allow_same_user_reads = o.allow_same_user_reads;
  if (o.lease_ttl_s > 0) u.lease_ttl_s = static_cast<std::uint64_t>(o.lease_ttl_s);
  return u;
}

}  // namespace weightcast::launcher::train

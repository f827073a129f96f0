// Options of weightcast-train and their command-line wiring.
//
// Every rank parses the same command line (mpirun passes it to all); nothing here touches MPI or
// the network, so parsing and the derived values (model spec, selector inputs, updater options)
// are unit-testable.
// Lifetime/threading: plain values and pure functions.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sync/model/atomic_groups.h"
#include "sync/model/lora.h"
#include "sync/model/model.h"
#include "sync/protocol/decision.h"
#include "sync/trainer/megatron.h"
#include "sync/trainer/updater.h"

namespace weightcast::launcher::train {

struct TrainOptions {
  int tp = 1;
  int pp = 1;
  // Expert parallelism: the first `ep` data-parallel replicas of a stage each hold
  // num_experts / ep experts (sync/trainer/megatron.h), in Megatron's `local` or `grouped` layout.
  int ep = 1;
  std::string expert_layout = "local";
  // Tensors an engine loads together stay in one bucket (sync/model/atomic_groups.h): auto (the
  // fused groups for MoE and MLA models, none for dense ones), fused, experts (fused, and each
  // expert's three matrices), off.
  std::string atomic_groups = "auto";
  std::vector<std::string> engines;

  // Model: a preset name or a config.json path, then per-field overrides.
  std::string model = "tiny";
  std::optional<std::int64_t> vocab_size, hidden_size, num_layers, num_heads, num_kv_heads,
      head_dim, intermediate_size, mtp_layers;
  std::optional<std::string> dtype;
  std::uint64_t seed = 0;

  int steps = 1;
  std::string bucket_bytes = "512M";
  int max_in_flight = 2;
  std::string backend = "gloo";
  std::string token;
  std::string store_token;
  std::string selector = "auto";  // auto | all | target | draft
  std::optional<std::string> speculative_algorithm;
  std::string conversion = "raw";  // raw | bridge
  bool verify = false;
  bool keep_going = false;           // run every step even when verification fails
  bool probe_accept_length = false;  // report each engine's speculative accept length per step
  std::string group_prefix = "weightcast";
  std::string bind_address = "127.0.0.1";
  std::string pause_mode = "abort";
  std::string engine_flavor = "auto";        // auto | weightcast | sglang | vllm
  std::string common_format = "per_tensor";  // per_tensor | flattened_bucket (common mode)
  std::string torch_store = "auto";          // auto | torch1 | torch2: the torch store's generation
  int flush_attempts = 60;                   // flush_cache tries while it answers non-200 (Miles)
  int flush_retry_ms = 1000;
  std::string sglang_reload_path;        // reload a half-updated SGLang engine from here
  int lease_ttl_s = 0;                   // 0: the engine's default
  bool allow_same_user_reads = false;    // PR_SET_PTRACER_ANY for single copy under Yama 1
  std::string colocate = "auto";         // off | on | auto (sync/trainer/colocated_sender.h)
  std::string colocate_memory = "host";  // host | cuda (sync/trainer/colocated_sender.h)

  int connect_timeout_ms = 5000;
  int request_timeout_ms = 60000;
  bool no_keep_alive = false;
  int update_timeout_ms = 300000;  // one stage's data phase
  int group_timeout_ms = 120000;
  int mpi_timeout_ms = 120000;  // gathers and waits between ranks, on top of the above
  int bucket_delay_ms = 0;
  std::string on_engine_failure = "fail";  // fail | drop (sync/trainer/engine_set.h)
  int probe_timeout_ms = 2000;
  int probe_backoff_max_steps = 16;
  int step_interval_ms = 0;    // pause between steps: the training compute (tests, demos)
  int cuda_device = -1;        // nccl: each stage source's CUDA device (-1: the current one)
  std::string delta = "auto";  // off | auto (sync/trainer/delta_source.h)
  std::string delta_codec = "xor_zstd";
  std::string shard = "auto";  // auto | off (sync/trainer/shard_classes.h)
  // overlap: the TP gather in groups of about a bucket, overlapped with the broadcast; whole: one
  // gather of the whole stage before the first bucket (launcher/train/stage_gather.h); auto:
  // overlap when the stage's ranks span hosts, whole when they share one.
  std::string tp_gather = "auto";
  std::string drift = "jump";  // jump (fill_tensor's step k) | realistic (sync/model/drift.h)
  double drift_lr = 0;         // 0: the realistic rate

  // LoRA (docs/lora.md): with a rank, the base stays frozen and each step sends only an adapter
  // of the modules --lora-targets names, under --lora-name.
  int lora_rank = 0;
  double lora_alpha = 0;  // 0: twice the rank
  std::vector<std::string> lora_targets = {"q_proj", "v_proj"};
  std::string lora_name = "weightcast";
};

// Registers every flag on `app`, writing into `options`.
void add_options(CLI::App& app, TrainOptions& options);

// The model spec: preset or JSON file, then the overrides; validated. Throws comm::ConfigError.
sync::ModelSpec resolve_model(const TrainOptions& options);

// Expert parallelism as the options give it (ep, layout).
sync::trainer::ExpertParallel expert_parallel(const TrainOptions& options);

// The atomic-group rule --atomic-groups picks for `spec`; nullopt for none.
std::optional<sync::GroupRule> atomic_group_rule(const TrainOptions& options,
                                                 const sync::ModelSpec& spec);

// Checks, before any rank starts, what the model and the flags must agree on: every stage splits
// over --tp and --ep, and every stage's atomic groups fit in --bucket-bytes. Throws
// comm::ConfigError naming the tensor or the group.
void check_model_layout(const TrainOptions& options, const sync::ModelSpec& spec);

// What the decision function gets: the speculative algorithm (the flag, else the one the
// engines report), the spec's MTP layers and the conversion mode.
sync::SelectorConfig selector_config(const TrainOptions& options, const sync::ModelSpec& spec,
                                     const std::optional<std::string>& engines_algorithm);

// The adapter's config under --lora-rank; nullopt without one. comm::ConfigError for a bad
// alpha, target or name.
std::optional<sync::LoraConfig> lora_config(const TrainOptions& options);

// The updater options: selector (explicit, or unset for auto), buckets, timeouts, backend.
sync::trainer::UpdaterOptions updater_options(const TrainOptions& options,
                                              const sync::SelectorConfig& config);

}  // namespace weightcast::launcher::train

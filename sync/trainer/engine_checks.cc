#include "sync/trainer/engine_checks.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

void check_engine_info(const std::string& url, const ServerInfoResponse& info, Selector selector,
                       Backend backend) {
  if (std::find(info.selectors.begin(), info.selectors.end(), selector) == info.selectors.end()) {
    std::string supported;
    for (Selector s : info.selectors)
      supported += std::string(supported.empty() ? "" : ", ") + std::string(to_string(s));
    throw comm::ConfigError("engine " + url + " does not support selector '" +
                            std::string(to_string(selector)) +
                            "' (it supports: " + (supported.empty() ? "none" : supported) +
                            "); refusing to update it rather than hope the scope is honoured");
  }
  if (std::find(info.backends.begin(), info.backends.end(), backend) == info.backends.end()) {
    throw comm::ConfigError("engine " + url + " does not support backend '" +
                            std::string(to_string(backend)) + "'");
  }
}

void check_common_format(std::span<EngineApi* const> engines, LoadFormat format) {
  if (format != LoadFormat::kWeightcastBucket) return;
  for (const EngineApi* e : engines) {
    if (e->flavor() == EngineFlavor::kSglang) {
      throw comm::ConfigError("engine " + e->url() +
                              " (sglang) lacks the weightcast_bucket layout; use per_tensor or "
                              "flattened_bucket for a group with SGLang engines");
    }
  }
}

void check_takes_adapters(const std::string& url, const ServerInfoResponse& info,
                          const std::string& adapter) {
  if (info.lora) return;
  throw comm::ConfigError("engine " + url +
                          " takes no LoRA adapters (its /server_info lists no lora_adapters); "
                          "refusing to send it adapter '" +
                          adapter + "'");
}

std::vector<ShardPlan> announced_shard_plans(const std::string& url,
                                             const ServerInfoResponse& info) {
  std::vector<ShardPlan> plans;
  for (std::size_t rank = 0; rank < info.shard_plans.size(); ++rank) {
    try {
      plans.push_back(shard_plan_from_json(nlohmann::json::parse(info.shard_plans[rank])));
    } catch (const std::exception& e) {
      throw comm::BadRequestError("engine " + url + ": the shard plan of rank " +
                                  std::to_string(rank) + " is refused: " + e.what());
    }
  }
  // A tensor every rank says absent is one the loader skips: as if no plan named it.
  if (plans.empty()) return plans;
  std::vector<std::string> skipped;
  for (const auto& [name, slice] : plans[0].tensors) {
    if (std::all_of(plans.begin(), plans.end(), [&name](const ShardPlan& p) {
          const TensorSlice* s = p.find(name);
          return s != nullptr && s->kind == TensorSlice::Kind::kAbsent;
        })) {
      skipped.push_back(name);
    }
  }
  for (auto& plan : plans) {
    for (const auto& name : skipped) plan.tensors.erase(name);
  }
  return plans;
}

void check_shard_plans(const std::string& url, std::span<const ShardPlan> plans,
                       std::span<const TensorMeta> tensors) {
  if (plans.empty()) return;
  std::vector<ShardPlan> narrowed(plans.size());
  for (const TensorMeta& t : tensors) {
    const bool named = std::any_of(plans.begin(), plans.end(),
                                   [&](const ShardPlan& p) { return p.find(t.name) != nullptr; });
    for (std::size_t rank = 0; rank < plans.size(); ++rank) {
      const TensorSlice* s = plans[rank].find(t.name);
      if (s != nullptr || !named) {
        narrowed[rank].tensors.emplace(t.name, s != nullptr ? *s : TensorSlice::replicated());
      }
    }
  }
  try {
    validate_shard_plans(tensors, narrowed);
  } catch (const comm::BadRequestError& e) {
    throw comm::BadRequestError("engine " + url + ": shard plan refused: " + e.what());
  }
}

}  // namespace weightcast::sync::trainer

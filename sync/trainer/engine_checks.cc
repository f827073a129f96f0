#include "sync/trainer/engine_checks.h"

#include <algorithm>

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

}  // namespace weightcast::sync::trainer

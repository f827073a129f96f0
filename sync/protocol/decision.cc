#include "sync/protocol/decision.h"

#include <string>

#include "comm/errors.h"

namespace weightcast::sync {

// Keep this the single decision point (see decision.h); callers must not add their own rules.
Selector weight_update_selector(const SelectorConfig& config) {
  if (config.mtp_num_layers.has_value() && *config.mtp_num_layers < 0) {
    throw comm::ConfigError("mtp_num_layers must be >= 0 (got " +
                            std::to_string(*config.mtp_num_layers) + ")");
  }
  const bool speculative =
      config.speculative_algorithm.has_value() && !config.speculative_algorithm->empty();
  const bool trains_mtp = config.mtp_num_layers.value_or(0) != 0;
  const bool bridge = config.conversion_mode.has_value() && *config.conversion_mode == "bridge";
  if (speculative && !trains_mtp && !bridge) return Selector::kTarget;
  return Selector::kAll;
}

}  // namespace weightcast::sync

// The selector decision: which runners a weight update must reach.
//
// This is the ONLY place in weightcast that decides the selector of an update session. Every
// other component (trainer session, engine client, engine server, receivers) carries the value
// this function returned and never re-derives it, so the decision cannot drift between the
// session and its payloads. The bug it prevents: a frozen draft model (speculative decoding
// without trained MTP layers) covered by an "all" session gets its non-idempotent post-load
// layout transform applied a second time and silently proposes garbage.
// Lifetime/threading: a pure function; safe from any thread.
#pragma once

#include <optional>
#include <string>

#include "sync/protocol/selector.h"

namespace weightcast::sync {

// The trainer-side configuration the decision depends on, as the trainer's options spell it.
struct SelectorConfig {
  // The engine's speculative decoding algorithm ("EAGLE", "EAGLE3", "NEXTN", ...); unset or
  // empty when speculative decoding is off.
  std::optional<std::string> speculative_algorithm;
  // Number of MTP layers the trainer trains and sends; unset or 0 when the draft is frozen.
  std::optional<int> mtp_num_layers;
  // How trainer weights are converted to engine names ("raw", "bridge", ...). The bridge
  // conversion emits draft tensors itself, so the draft must stay covered.
  std::optional<std::string> conversion_mode;
};

// Selector::kTarget exactly when a speculative algorithm is set and non-empty, MTP layers are
// absent or 0, and the conversion mode is not "bridge"; Selector::kAll otherwise. A negative
// mtp_num_layers is a configuration mistake and throws comm::ConfigError.
Selector weight_update_selector(const SelectorConfig& config);

}  // namespace weightcast::sync

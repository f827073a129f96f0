// What the coordinator asks the engines besides the update itself: the speculative algorithm they
// run (for the selector decision) and the accept-length probe printed with each step.
// Lifetime/threading: plain calls on the caller's thread, each bounded by the clients' timeouts.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "launcher/train/train_options.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::launcher::train {

// The speculative algorithm every engine of `o.engines` reports in /server_info. Throws
// comm::ConfigError when they disagree, EngineCallError when one cannot be asked.
std::optional<std::string> engines_speculative_algorithm(const TrainOptions& o);

// " accept_length A,B,..." — each engine's /spec_accept_length, "n/a" where the probe failed
// (the failure is printed to stderr).
std::string accept_lengths(std::span<sync::trainer::EngineApi* const> engines);

}  // namespace weightcast::launcher::train

// Small closed vocabularies of the engine HTTP API besides selectors and dtypes: the data-plane
// backend a weight update group uses, and how pause_generation treats running requests.
//
// Each parse_* accepts exactly the wire spelling and throws comm::BadRequestError quoting the
// value and listing the valid ones; to_string gives the wire spelling back.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <string_view>

namespace weightcast::sync {

// "nccl" (CUDA device buffers) or "gloo" (host buffers over TCP). SGLang passes any
// torch.distributed backend name through; we accept the two we implement.
enum class Backend { kNccl, kGloo };
inline constexpr std::array<Backend, 2> kAllBackends = {Backend::kNccl, Backend::kGloo};
Backend parse_backend(std::string_view text);
std::string_view to_string(Backend backend);

// SGLang's pause modes: "abort" returns running requests, "retract" moves them back to the
// waiting queue, "in_place" keeps them (and their KV cache) where they are.
enum class PauseMode { kAbort, kRetract, kInPlace };
inline constexpr std::array<PauseMode, 3> kAllPauseModes = {PauseMode::kAbort, PauseMode::kRetract,
                                                            PauseMode::kInPlace};
PauseMode parse_pause_mode(std::string_view text);
std::string_view to_string(PauseMode mode);

}  // namespace weightcast::sync

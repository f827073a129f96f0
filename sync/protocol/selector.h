// Selectors and runners: which parts of an engine a weight update reaches.
//
// An engine holds two runners, the target model and the draft model used for speculative
// decoding. A selector names the set of runners one update session covers; the session and every
// payload in it carry the same selector, and an engine applies a payload only to covered runners.
// The value is decided in exactly one place, weight_update_selector() in sync/protocol/decision.h.
// Runner names are an enum, not free strings, so a typo cannot silently cover nothing; the wire
// spelling is "target" / "draft" and parse_runner() is the only way in from text.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "comm/enum_names.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {

enum class Selector { kAll, kTarget, kDraft };
enum class Runner { kTarget, kDraft };

// Wire spellings: "all", "target", "draft" (exact, lower case).
inline constexpr auto kSelectorNames = comm::enum_names<Selector>(
    "selector",
    {{Selector::kAll, "all"}, {Selector::kTarget, "target"}, {Selector::kDraft, "draft"}});
inline constexpr auto kRunnerNames =
    comm::enum_names<Runner>("runner", {{Runner::kTarget, "target"}, {Runner::kDraft, "draft"}});

inline constexpr std::array<Selector, 3> kAllSelectors = kSelectorNames.values();
inline constexpr std::array<Runner, 2> kAllRunners = kRunnerNames.values();

// Anything but a wire spelling throws comm::BadRequestError that quotes the value and lists the
// valid spellings.
inline Selector parse_selector(std::string_view text) {
  return parse_name(kSelectorNames, text);
}
inline std::string_view to_string(Selector selector) {
  return kSelectorNames.name(selector);
}

inline Runner parse_runner(std::string_view text) {
  return parse_name(kRunnerNames, text);
}
inline std::string_view to_string(Runner runner) {
  return kRunnerNames.name(runner);
}

// Whether a session or payload with `selector` may touch `runner`: kAll covers both runners,
// kTarget and kDraft cover only the runner of the same name.
bool covers(Selector selector, Runner runner);

// The covered runners in kAllRunners order.
std::vector<Runner> covered_runners(Selector selector);

}  // namespace weightcast::sync

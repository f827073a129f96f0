#include "comm/gloo/gloo_errors.h"

#include <array>

namespace weightcast::comm::gloo_backend {

namespace {
// Raised by Gloo when a wait on an unbound buffer times out: it then fails every pair of the
// context with the second phrase.
constexpr std::string_view kWaitTimedOut = "Timed out waiting";
constexpr std::string_view kTeardown = "Application timeout caused pair closure";
}  // namespace

bool is_gloo_timeout(std::string_view what) {
  constexpr std::array<std::string_view, 5> kPhrases = {kWaitTimedOut, kTeardown, "Read timeout",
                                                        "Write timeout", "Connect timeout"};
  for (auto p : kPhrases) {
    if (what.find(p) != std::string_view::npos) return true;
  }
  return false;
}

bool is_local_teardown(std::string_view what) {
  return what.find(kTeardown) != std::string_view::npos;
}

}  // namespace weightcast::comm::gloo_backend

// Time bounds for tests that prove something about a deadline, written to hold under load.
//
// Role: one place that says how far a timed claim may stretch when ctest runs tests side by side
// on a busy machine (ctest -j2 on two shared cores), where a process can lose seconds to the
// scheduler between an event and the moment a test observes it. Header-only constants and pure
// functions; no state, any thread.
//
// Two claims, two bounds, both relative to the deadline the test configured:
//  - "ended by its deadline, not before": at least deadline / 2 (load only makes things later, so
//    the lower bound is safe as it is) and at most late_bound(deadline): twice the deadline plus
//    a fixed scheduling allowance. A process that ignored its deadline still runs past that bound
//    (it hangs until the test's own limit), so the bound proves what it proved before.
//  - "ended without waiting for a deadline" (a closed socket, a visible mismatch): less than
//    fast_bound(deadline) = deadline / 2, which holds under load only when the deadline is long
//    next to a loaded run of the fast path. Such tests configure at least kFastFailureDeadline;
//    a passing run does not wait for it, so the long deadline costs nothing.
#pragma once

#include <chrono>

namespace weightcast::testing {

// What a loaded two-core machine may add between an event and a test's observation of it
// (measured: 1.2 s over a 4 s bound in GlooProcessTest under ctest -j2; allowance with margin).
inline constexpr std::chrono::milliseconds kSchedulingAllowance{5000};

// The shortest deadline a "did not wait for it" claim may use.
inline constexpr std::chrono::milliseconds kFastFailureDeadline{16000};

// The latest a deadline-bound failure may be observed.
constexpr std::chrono::milliseconds late_bound(std::chrono::milliseconds deadline) {
  return 2 * deadline + kSchedulingAllowance;
}
constexpr double late_bound_ms(double deadline_ms) {
  return 2.0 * deadline_ms + static_cast<double>(kSchedulingAllowance.count());
}
constexpr double late_bound_s(double deadline_s) {
  return late_bound_ms(1000.0 * deadline_s) / 1000.0;
}

// The latest a failure that must not wait for its deadline may be observed.
constexpr std::chrono::milliseconds fast_bound(std::chrono::milliseconds deadline) {
  return deadline / 2;
}

}  // namespace weightcast::testing

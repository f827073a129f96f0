// Deadlines. Every blocking call in weightcast takes a timeout (a duration, converted to a
// Deadline at entry); helpers here keep the arithmetic in one place.
#pragma once

#include <algorithm>
#include <chrono>

namespace weightcast::comm {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using Millis = std::chrono::milliseconds;

// Saturates instead of overflowing, so Millis::max() means "no practical limit" (still a
// deadline, centuries away).
inline Deadline deadline_after(Millis timeout) {
  const auto now = Clock::now();
  const auto room = std::chrono::duration_cast<Millis>(Deadline::max() - now);
  return timeout >= room ? Deadline::max() : now + timeout;
}

// Time left until `deadline`, never negative.
inline Millis remaining(Deadline deadline) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
}

inline bool expired(Deadline deadline) {
  return Clock::now() >= deadline;
}

// Seconds from `start` to now (for reports and timings).
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace weightcast::comm

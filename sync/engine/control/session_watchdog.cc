#include "sync/engine/control/session_watchdog.h"

#include <algorithm>

namespace weightcast::sync::engine {

SessionWatchdog::SessionWatchdog(EngineContext& ctx)
    : ctx_(ctx), thread_([this](std::stop_token stop) { loop(stop); }) {}

SessionWatchdog::~SessionWatchdog() {
  thread_.request_stop();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SessionWatchdog::loop(std::stop_token stop) {
  const auto period =
      std::clamp(ctx_.opts.session_timeout / 4, comm::Millis(10), comm::Millis(200));
  std::unique_lock lock(ctx_.mu);
  while (!stop.stop_requested()) {
    cv_.wait_for(lock, stop, period, [] { return false; });
    if (stop.stop_requested()) continue;
    const auto open = ctx_.receiver.session();
    if (!open) {
      // A trainer pauses generation for an update and resumes it at the end, even after a
      // failure; a pause that sees no session and no request for this long was left by a
      // trainer that died, and would otherwise last forever.
      if (ctx_.receiver.paused() &&
          comm::Clock::now() - ctx_.last_activity >= ctx_.opts.session_timeout) {
        ctx_.receiver.set_paused(false);
      }
      continue;
    }
    // A bucket in flight is bounded by the group's collective timeout, not by this one.
    if (ctx_.receiver.busy()) {
      ctx_.last_activity = comm::Clock::now();
      continue;
    }
    if (comm::Clock::now() - ctx_.last_activity < ctx_.opts.session_timeout) continue;
    ctx_.fail_session_locked(open->id,
                             "session timed out: no request for " +
                                 std::to_string(ctx_.opts.session_timeout.count()) + " ms",
                             /*abort_groups=*/true, 504);
  }
}

}  // namespace weightcast::sync::engine

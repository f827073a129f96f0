// SessionWatchdog: aborts an update session that sees no request for the session timeout while no
// bucket is in flight (its trainer is gone, and its groups with it), and resumes generation left
// paused with no session and no request for as long.
// Lifetime: owned by the Engine; its thread starts at construction and is joined at destruction.
// Threading: its thread takes the context's lock for each look.
#pragma once

#include <condition_variable>
#include <stop_token>
#include <thread>

#include "sync/engine/control/engine_context.h"

namespace weightcast::sync::engine {

class SessionWatchdog {
 public:
  explicit SessionWatchdog(EngineContext& ctx);
  ~SessionWatchdog();
  SessionWatchdog(const SessionWatchdog&) = delete;
  SessionWatchdog& operator=(const SessionWatchdog&) = delete;

 private:
  void loop(std::stop_token stop);

  EngineContext& ctx_;
  std::condition_variable_any cv_;
  std::jthread thread_;  // last: started once the members it reads exist
};

}  // namespace weightcast::sync::engine

// Lease: which trainer may update the engine across sessions.
//
// A session lasts one update; between two of a trainer's sessions another trainer could get in
// and the engine would alternate between their weights. So the first begin of a client that
// names itself (a holder) takes a lease: holder, a random id, a time to live. Every begin and
// end of the holder's sessions renews it. While it lives, a begin from anyone else, an id-less
// begin, and a sessionless update are refused, naming the holder and the seconds left. It ends
// when the holder releases it (with its id), when its time to live passes without a renewal
// (the holder vanished), or when an operator breaks it (force; the engine's token where one is
// configured). Clients that never name themselves (SGLang, slime) never take one.
// Lifetime: owned by the EngineContext. Threading: not synchronized; callers hold its lock.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "comm/deadline.h"
#include "sync/engine/control/session.h"

namespace weightcast::sync::engine {

class Lease {
 public:
  using Clock = std::chrono::steady_clock;

  // Whether a begin from `holder` (nullopt: an id-less client) carrying `lease_id` may open a
  // session at `now`: nullopt when no lease lives or the id is the live lease's. `route` names
  // the refused call in the message.
  std::optional<Refusal> check(const std::optional<std::string>& holder,
                               const std::optional<std::string>& lease_id, std::string_view route,
                               Clock::time_point now) const;
  // Takes the lease for `holder` (a new id) when none lives, else renews the live one, which
  // check() let through; `ttl` > 0. Returns the lease id.
  const std::string& take(const std::string& holder, comm::Millis ttl, Clock::time_point now);
  // Extends a live lease by its time to live. No-op without one.
  void renew(Clock::time_point now);
  // Ends the lease: with `force`, whatever its id; else `lease_id` must be the live one's
  // (compared in constant time). A refusal (409) when the id is another's; nullopt also when no
  // lease lives (releasing is idempotent).
  std::optional<Refusal> release(const std::optional<std::string>& lease_id, bool force,
                                 Clock::time_point now);

  bool alive(Clock::time_point now) const { return !id_.empty() && now < expires_; }
  const std::string& holder() const { return holder_; }
  double seconds_left(Clock::time_point now) const;
  comm::Millis ttl() const { return ttl_; }

 private:
  std::string id_;
  std::string holder_;
  comm::Millis ttl_{0};
  Clock::time_point expires_{};
};

}  // namespace weightcast::sync::engine

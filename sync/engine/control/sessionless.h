// Sessionless updates: what an update request covers when it arrives with no session open, as
// slime and plain SGLang clients send it (docs/protocol.md, "Sessionless updates").
//
// The request is applied as one atomic session of its own: received, checked, committed, and
// only then answered. Its scope is the runners its selector covers (absent: all), less every
// runner the engine was started with as frozen (--frozen-runner), unless the engine was told
// that sessionless updates may touch them (--sessionless-updates-frozen). That keeps the seed's
// bug (a frozen draft re-processed by an update that did not mean it) from coming back through
// a client that knows no sessions.
// Lifetime/threading: pure function; safe from any thread.
#pragma once

#include <optional>
#include <set>
#include <variant>
#include <vector>

#include "sync/engine/control/session.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync::engine {

struct SessionlessRules {
  std::set<Runner> frozen;    // runners a sessionless update never touches
  bool touch_frozen = false;  // --sessionless-updates-frozen: it may after all
};

// The selector of the one-request session, from the runners the engine holds (`held`) and the
// request's own selector; a refusal (400) when that leaves no runner.
std::variant<Refusal, Selector> sessionless_scope(const std::vector<Runner>& held,
                                                  std::optional<Selector> asked,
                                                  const SessionlessRules& rules);

}  // namespace weightcast::sync::engine

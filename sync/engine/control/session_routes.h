// SessionRoutes: the engine's session routes — begin, update_weight_version, end and abort of an
// update session, the holder's lease, and pause/continue/flush — over the Receiver's one session
// state machine (sync/engine/control/session.h). This class checks leases and words each route's
// answer in the request's dialect; the session rules themselves are the Receiver's.
// Lifetime: a part of the Engine (one of its bases). Threading: every method is thread-safe (the
// context's lock).
#pragma once

#include "sync/engine/control/engine_context.h"
#include "sync/engine/control/reply.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

// One method per route: each takes the parsed request body and returns the route's reply.
class SessionRoutes {
 public:
  explicit SessionRoutes(EngineContext& ctx) : ctx_(ctx) {}

  Reply begin_weight_update(const BeginWeightUpdateRequest& request);
  Reply update_weight_version(const UpdateWeightVersionRequest& request);
  Reply end_weight_update(const EndWeightUpdateRequest& request = {});
  Reply abort_weight_update(const AbortWeightUpdateRequest& request = {});
  Reply release_lease(const ReleaseLeaseRequest& request);
  Reply pause_generation(const PauseGenerationRequest& request);
  Reply continue_generation(const ContinueGenerationRequest& request);
  Reply flush_cache();
  Reply unload_lora_adapter(const UnloadLoraAdapterRequest& request);

 private:
  EngineContext& ctx_;
};

}  // namespace weightcast::sync::engine

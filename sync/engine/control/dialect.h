// The two dialects of the engine's HTTP API (docs/protocol.md, "Two dialects").
//
// Native requests carry something only weightcast clients send (a session_id, a bucket sequence,
// a delta, our padded bucket format, a holder, a rendezvous); their failures keep the status that
// names the rule (409 state, 504 timeout, 500 engine fault). Everything else is an SGLang-dialect
// request, as slime, Miles and plain SGLang clients send it, and is answered as SGLang answers:
// every failure 400 with {"success": false, "message"}. 401 and 403 (the token, the allowed
// master addresses) stay in both dialects: they are the deployment's refusals, not the engine's.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include "sync/engine/control/reply.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

bool native_request(const UpdateWeightsFromDistributedRequest& request);
bool native_request(const BeginWeightUpdateRequest& request);
bool native_request(const InitWeightsUpdateGroupRequest& request);
// Requests whose only native field is the session id (update_weight_version, end, abort).
template <typename Request>
bool native_request(const Request& request) {
  return request.session_id.has_value();
}

// `reply` as the request's dialect answers it: unchanged for native requests; for SGLang's,
// every failure status but 401/403 becomes 400 (the body already has SGLang's shape).
Reply in_dialect(bool native, Reply reply);

}  // namespace weightcast::sync::engine

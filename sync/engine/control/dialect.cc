#include "sync/engine/control/dialect.h"

namespace weightcast::sync::engine {

bool native_request(const UpdateWeightsFromDistributedRequest& request) {
  return request.session_id || request.sequence || request.delta ||
         request.load_format == LoadFormat::kWeightcastBucket;
}

bool native_request(const BeginWeightUpdateRequest& request) {
  return request.holder || request.lease_id;
}

bool native_request(const InitWeightsUpdateGroupRequest& request) {
  return request.rendezvous.has_value();
}

Reply in_dialect(bool native, Reply reply) {
  // 401/403 are not the engine's refusals but the deployment's (token, allowed addresses): both
  // dialects keep them, as an SGLang server behind an API key answers them too.
  if (!native && reply.status >= 300 && reply.status != 401 && reply.status != 403) {
    reply.status = 400;
  }
  return reply;
}

}  // namespace weightcast::sync::engine

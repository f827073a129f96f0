// BucketRoutes: the engine's data-plane routes — joining and leaving groups, and bucket requests,
// inside a session or as a sessionless update (sync/engine/control/sessionless.h), which opens
// the Receiver's session itself for one request and commits it when the bucket is staged.
// Lifetime: a part of the Engine (one of its bases). Threading: thread-safe; a bucket request
// blocks its caller until the bucket is staged (or failed), several at once, in any sequence order;
// sessionless updates apply one at a time.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <variant>

#include "sync/engine/control/engine_context.h"
#include "sync/engine/control/reply.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/tensor_update.h"

namespace weightcast::sync::engine {

class BucketRoutes {
 public:
  explicit BucketRoutes(EngineContext& ctx) : ctx_(ctx) {}

  Reply init_weights_update_group(const InitWeightsUpdateGroupRequest& request);
  Reply destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest& request);
  // The answer in the request's dialect.
  Reply update_weights_from_distributed(const UpdateWeightsFromDistributedRequest& request);
  // The colocated path (docs/colocated.md): one bucket copied out of the trainer's shared
  // segment into the open session's staging.
  Reply update_weights_from_tensor(const UpdateWeightsFromTensorRequest& request);

 private:
  // The bucket route in the engine's own statuses.
  Reply receive_bucket(const UpdateWeightsFromDistributedRequest& request);
  // receive_bucket()'s first step, under the lock: opens a sessionless update's session when the
  // request needs one (taking `serial` for it) and queues the request on the receiver; the reply
  // of a refusal, else the ticket and the sessionless session's token.
  struct Admitted {
    Receiver::Ticket ticket;
    std::optional<std::string> sessionless_token;
  };
  std::variant<Reply, Admitted> admit_bucket(const UpdateWeightsFromDistributedRequest& request,
                                             std::unique_lock<std::timed_mutex>& serial);
  // Opens the one-request session of a sessionless update; its token, or why it was refused.
  std::variant<Refusal, std::string> open_sessionless_locked(
      const UpdateWeightsFromDistributedRequest& request);
  // Queues a bucket request on the receiver, which checks it against its session, groups and
  // runners.
  std::variant<Refusal, Receiver::Ticket> submit_bucket_locked(
      const UpdateWeightsFromDistributedRequest& request,
      const std::optional<std::string>& sessionless_token);

  EngineContext& ctx_;
  // Held for the whole of a sessionless update, so they apply one at a time.
  std::timed_mutex sessionless_mu_;
};

}  // namespace weightcast::sync::engine

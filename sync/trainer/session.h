// UpdateSession: one open weight update on the engines — the version it will commit, the
// selector it was opened with, and the session id each engine answered (the session is ours on
// that engine only while we carry its id: docs/protocol.md, "Session owners").
//
// The session is the only source of bucket payloads: bucket_request() stamps every request with
// the session's selector and version, so trainer code cannot build a payload whose scope differs
// from its session (the engine would refuse it with 409, but it is never sent). The coordinator
// gets the session from DistributedUpdater::open_session(); the sources of other pipeline stages,
// in other processes, join it from the token the coordinator hands them (join_session()).
// Lifetime/threading: an immutable value; safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/model/bucket.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor_update.h"

namespace weightcast::sync::trainer {

class UpdateSession {
 public:
  Selector selector() const { return selector_; }
  const std::string& version() const { return version_; }
  // The id engine `engine` answered at begin; nullopt when it issued none (SGLang) or was not
  // asked. `engine` counts the session's members (all engines unless the set is elastic).
  std::optional<std::string> session_id(std::size_t engine) const;
  // `request` as engine `engine` must receive it: stamped with that engine's session id.
  UpdateWeightsFromDistributedRequest for_engine(UpdateWeightsFromDistributedRequest request,
                                                 std::size_t engine) const;

  // The request announcing bucket `plan` on group `group_name`, its tensors travelling as
  // `format` says. Our bucket carries its sequence; SGLang's formats carry none (arrival order).
  UpdateWeightsFromDistributedRequest bucket_request(
      const BucketPlan& plan, const std::string& group_name,
      LoadFormat format = LoadFormat::kWeightcastBucket) const;

  // The colocated request announcing bucket `plan`, its tensors at `offsets` (one per entry) of
  // the segment `segment`, with `digests` (one per tensor), as engine `engine` must receive it:
  // stamped like bucket_request() and with that engine's session id, which the engine also
  // expects on the segment's handle.
  UpdateWeightsFromTensorRequest segment_request(const BucketPlan& plan,
                                                 std::vector<std::uint64_t> offsets,
                                                 SegmentHandle segment,
                                                 std::vector<std::string> digests,
                                                 std::size_t engine) const;

  // The engines the session covers (indices into the updater's engine list, in order), and the
  // group epoch they form (sync/trainer/engine_set.h). Empty members: every engine, epoch 0.
  const std::vector<std::size_t>& members() const { return members_; }
  std::uint64_t epoch() const { return epoch_; }

  // The version every member confirmed holding at begin, which this trainer committed to all of
  // them last (delta updates: sync/trainer/delta_source.h); nullopt when any member may hold
  // something else (restarted, re-admitted, or the last update failed).
  const std::optional<std::string>& delta_base() const { return delta_base_; }

  // The adapter an adapter session updates (its lora_name; docs/lora.md); nullopt: the base
  // weights. An adapter session is always of selector target, its version() and delta_base()
  // are the adapter's (the version of it every member confirmed holding), not the base weights'.
  const std::optional<std::string>& adapter() const { return adapter_; }

  // Text a coordinator passes to the other stage sources: "<selector> <version> <ids>", the ids
  // comma-separated in member order, "-" for an engine without one ("<selector> <version>" when
  // no engine issued one), then " m<epoch>:<members>" when the session names its members, then
  // " base=<version>" when it has a delta base, then " lora=<name>" for an adapter session.
  std::string token() const;

 private:
  friend class SessionDriver;
  friend UpdateSession join_session(std::string_view token);
  friend UpdateSession join_session_without_base(std::string_view token);
  std::string token_without_base() const;
  UpdateSession(Selector selector, std::string version, std::vector<std::string> ids = {})
      : selector_(selector), version_(std::move(version)), session_ids_(std::move(ids)) {}

  UpdateSession with_members(std::vector<std::size_t> members, std::uint64_t epoch) && {
    members_ = std::move(members);
    epoch_ = epoch;
    return std::move(*this);
  }

  Selector selector_;
  std::string version_;
  std::vector<std::string> session_ids_;  // per member; "" = none
  std::vector<std::size_t> members_;
  std::uint64_t epoch_ = 0;
  std::optional<std::string> delta_base_;
  std::optional<std::string> adapter_;
};

// The session a coordinator opened, from its token(). Throws comm::BadRequestError on a token
// that UpdateSession::token() did not produce.
UpdateSession join_session(std::string_view token);

}  // namespace weightcast::sync::trainer

// ReceiverState: what the parts of a Receiver (sync/engine/commit/receiver.h) share under its one
// lock: the open session, the joined groups, the committed base and the data-plane counters.
// The Receiver owns one; its BucketIntake (sync/engine/commit/bucket_intake.h) takes buckets
// into it, the Receiver itself opens, commits and ends sessions on it.
// Lifetime: owned by the Receiver. Threading: every member but `mu` is guarded by `mu`.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "sync/engine/commit/open_session.h"
#include "sync/engine/commit/receiver_base.h"
#include "sync/engine/control/group_table.h"

namespace weightcast::sync::engine {

class ReceiverState {
 public:
  // `ranks` local ranks, `sliced`: they stage slices; `keep_delta_base`: keep committed bytes.
  ReceiverState(int ranks, bool sliced, bool keep_delta_base)
      : session(ranks, sliced), base(keep_delta_base) {}

  // Ends session `session_id` if it is still the open one (returns whether it was), discarding
  // what it staged. Groups left half-way through a broadcast cannot be reused, their peers being
  // out of step: with `abort_busy_groups` those with a bucket in flight are aborted, with
  // `abort_used_groups` every group that took a bucket of the session. Caller holds `mu`.
  bool fail_session_locked(std::uint64_t session_id, bool abort_busy_groups, int status,
                           const std::string& reason, bool abort_used_groups = false);

  mutable std::mutex mu;
  OpenSession session;  // the session state machine and what the open session holds
  GroupTable groups;
  ReceiverBase base;
  std::uint64_t experts_dropped = 0;
  std::uint64_t bytes_copied = 0;  // colocated buckets copied out of trainers' segments
};

}  // namespace weightcast::sync::engine

// BucketIntake: how a Receiver (sync/engine/commit/receiver.h) takes bucket requests into its
// open session. Two paths, one set of rules:
//  - a group's bucket (update_weights_from_distributed): checked against the session (payload,
//    selector, owner), routed to the runners and ranks that take its tensors, planned (sequence,
//    sizes, delta base), queued on its group's receive pipeline, then waited for;
//  - a colocated bucket (update_weights_from_tensor, docs/colocated.md): the same checks, then
//    copied out of the trainer's shared segment (or a bucket already in this process) without
//    the lock, hashed on the way, and staged for every rank.
// A refused request changes nothing; a failure after a bucket was queued ends the session (and
// aborts a group left out of step) and is returned by wait() instead of thrown.
// Lifetime: owned by the Receiver, which outlives it and owns what the references point to.
// Threading: every method may be called from several threads; state changes under
// ReceiverState::mu, copies and waits without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/colocate/segment_mappings.h"
#include "comm/deadline.h"
#include "sync/engine/commit/local_ranks.h"
#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/commit/receiver_state.h"
#include "sync/engine/commit/weight_version.h"
#include "sync/engine/lora/adapter_store.h"
#include "sync/engine/receive/segment_copy.h"
#include "sync/engine/runners/delta_base.h"
#include "sync/engine/stage/block_pool.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

// A bucket request that was not received and staged: the status the control plane answers, the
// reason, and what failed. `group_failed`: the group was aborted (the trainer re-initializes it);
// `stale`: the session was aborted by another request meanwhile (409, the group is fine).
struct ReceiveFailure {
  int status = 500;
  std::string reason;
  bool group_failed = false;
  bool stale = false;
  bool ended_session = false;  // this failure ended the session (not another one before it)
};

struct ReceiveOutcome {
  std::uint64_t sequence = 0;
  std::size_t bytes = 0;  // staged (the whole bucket, also for a delta)
  std::optional<ReceiveFailure> failure;
};

// What BucketIntake takes of ReceiverOptions.
struct IntakeOptions {
  comm::Millis comm_timeout{60000};  // each bucket's broadcast, and a segment's hand-over
  std::size_t max_bucket_bytes = std::size_t{4} << 30;
  std::uint64_t max_buckets_ahead = 8;
  DeltaBaseSource base_source;        // null: deltas against ReceiverState::base
  bool keep_segment_mappings = true;  // comm/colocate/segment_mappings.h
  int cuda_device = 0;  // where a device segment's CUDA IPC handle is opened (-1: current device)
};

// The parts of the Receiver a BucketIntake reads.
struct IntakeParts {
  const std::vector<ReceiverRunner>& runners;
  const LocalRanks& ranks;
  std::shared_ptr<BlockPool> pool;
  std::shared_ptr<WeightVersion> version;
  const AdapterStore& adapters;
};

class BucketIntake {
 public:
  // Stages into `state` (its session, groups and base, under state.mu).
  BucketIntake(IntakeOptions options, IntakeParts parts, ReceiverState& state);
  BucketIntake(const BucketIntake&) = delete;
  BucketIntake& operator=(const BucketIntake&) = delete;

  // A queued bucket. One of a group none of this receiver's ranks joined has no job: wait()
  // answers it at once, with 0 bytes.
  struct Ticket {
    std::shared_ptr<BucketJob> job;
    std::shared_ptr<Group> group;
    std::uint64_t session_id = 0;
  };
  // Checks and queues a group's bucket (a refusal throws ReceiverError and changes nothing).
  Ticket submit(const UpdateWeightsFromDistributedRequest& request);
  // Blocks (bounded) until the bucket is staged or failed.
  ReceiveOutcome wait(const Ticket& ticket);
  // A colocated bucket out of the trainer's segment (Receiver::receive_segment).
  std::size_t receive_segment(const UpdateWeightsFromTensorRequest& request,
                              const std::optional<std::string>& handle_token);
  // A colocated bucket already in this process's memory (Receiver::receive_local).
  std::size_t receive_local(const UpdateWeightsFromTensorRequest& request,
                            std::span<const std::byte> bytes);

 private:
  Ticket submit_locked(const UpdateWeightsFromDistributedRequest& request);
  // The delta a bucket carries, against the adapter held under its name (adapter session), the
  // engine's own weights (base_source) or the kept copy of the last committed tensors; null for
  // a full bucket. A refusal throws ReceiverError.
  std::shared_ptr<const DeltaSpec> delta_spec_locked(
      const UpdateWeightsFromDistributedRequest& request, const ShardPlan* slices);
  // The staging destinations of a payload's tensors in the open session (adapter sessions route
  // LoRA tensors only). `slices`: the plan of the ranks of the group the payload came on
  // (LocalRanks::plan_of), and `shard_class` the key its names are sent once under
  // (OpenSession::names).
  std::vector<std::vector<Runner>> destinations_locked(Selector selector,
                                                       const std::vector<TensorMeta>& tensors,
                                                       const ShardPlan* slices = nullptr,
                                                       const std::string& shard_class = {});
  // receive_segment / receive_local: the checks, then `copy` without the lock, then staging.
  using CopyBucket = std::function<std::vector<SegmentTensor>(const std::string& token)>;
  std::size_t stage_copied(const UpdateWeightsFromTensorRequest& request,
                           const std::optional<std::string>& handle_token, const CopyBucket& copy);

  const IntakeOptions opts_;
  const IntakeParts parts_;
  ReceiverState& state_;
  comm::colocate::SegmentMappings mappings_;  // the colocated path's kept mappings
};

}  // namespace weightcast::sync::engine

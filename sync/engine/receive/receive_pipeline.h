// Group: one joined weight-update group (one per trainer PP stage) and its receive pipeline.
//
// Each engine rank has a receive thread and an unpack thread. Buckets are submitted by the HTTP
// handlers as BucketJobs in whatever order the requests arrive; every rank receives them strictly
// in sequence order (0, 1, 2, ... per session), each as one broadcast into one of two receive
// slots, while its unpack thread digests and stages the previous bucket from the other slot:
// unpacking of bucket k overlaps the receive of bucket k+1. A host slot is a pool block per
// bucket (sync/engine/stage/block_pool.h), received into directly (per-tensor broadcasts land at
// their offsets in it); rank 0 stages views of it, so the engine never copies a byte it received. A
// job completes when every rank has staged it. Any receive or unpack failure aborts the whole
// group: its channels are aborted, every pending job fails with the cause (504 for a timeout, 500
// otherwise), and later submits are refused; the trainer re-initializes the group to recover. A
// later bucket that waits for a missing one more than the collective timeout fails the group too,
// so nothing waits forever. Lifetime: owned by the Receiver (shared_ptr); destruction aborts and
// joins the threads. Threading: every public method is thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "comm/deadline.h"
#include "sync/engine/control/session.h"
#include "sync/engine/receive/channel.h"
#include "sync/engine/stage/block_pool.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/bucket.h"
#include "sync/model/checksum.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

struct JobResult {
  int status = 200;  // 200, or the HTTP status of the failure
  std::string message;
  // The bucket was received but cannot be applied (a delta whose base this engine does not hold,
  // or a payload that does not decode): the group is fine, the session must be aborted.
  bool session_failed = false;
};

// A bucket that travels as a delta (sync/model/delta.h): `wire_bytes` of payload arrive instead
// of the bucket, and each rank applies them to the base that fill_base writes into its buffer for
// the job's plan and destinations (sync/engine/runners/delta_base.h); fill_base returns a refusal
// message when the engine does not hold the base.
struct DeltaSpec {
  using FillBase = std::function<std::optional<std::string>(
      const BucketPlan& plan, const std::vector<std::vector<Runner>>& destinations,
      std::span<std::byte> bucket)>;
  DeltaCodec codec = DeltaCodec::kXorZstd;
  std::size_t wire_bytes = 0;
  FillBase fill_base;
};

// One bucket request: what to receive and where each tensor goes.
class BucketJob {
 public:
  // destinations[i]: the runners entry i of `plan` is staged for (may be empty).
  // `per_tensor`: the source sends one broadcast per entry (into its place in the plan) instead
  // of one broadcast of the whole bucket. `expected`: the trainer's digest of each entry's new
  // bytes (empty: it sent none); checked after decoding, before anything is staged.
  BucketJob(std::uint64_t session_id, BucketPlan plan,
            std::vector<std::vector<Runner>> destinations, std::shared_ptr<Staging> staging,
            bool per_tensor = false, std::shared_ptr<const DeltaSpec> delta = nullptr,
            std::vector<Digest> expected = {});

  std::uint64_t session_id() const { return session_id_; }
  std::uint64_t sequence() const { return plan_.sequence; }
  const BucketPlan& plan() const { return plan_; }
  const std::vector<std::vector<Runner>>& destinations() const { return destinations_; }
  Staging& staging() const { return *staging_; }
  bool per_tensor() const { return per_tensor_; }
  const DeltaSpec* delta() const { return delta_.get(); }
  // Bytes the broadcast carries: the delta payload, or the whole bucket.
  std::size_t wire_bytes() const { return delta_ ? delta_->wire_bytes : plan_.total_bytes; }

  // The first result wins; later calls are ignored.
  void finish(JobResult result);
  // The result, or nullopt when `deadline` passed first.
  std::optional<JobResult> wait(comm::Deadline deadline) const;

 private:
  friend class Group;
  const std::uint64_t session_id_;
  const BucketPlan plan_;
  const std::vector<std::vector<Runner>> destinations_;
  const std::shared_ptr<Staging> staging_;
  const bool per_tensor_;
  const std::shared_ptr<const DeltaSpec> delta_;
  const std::vector<Digest> expected_;
  int ranks_done_ = 0;  // guarded by the owning Group's mutex
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<JobResult> result_;
};

struct GroupOptions {
  comm::Millis comm_timeout{60000};  // each broadcast, and the wait for a missing bucket
  // How far ahead of the next expected bucket a request may be; each waiting request holds an
  // HTTP worker thread, so this stays below the server's thread count.
  std::uint64_t max_ahead = 8;
  // Where buckets are received (host memory): the runners' pool, so committed weights return
  // their blocks for the next update. Null: the group keeps a pool of its own.
  std::shared_ptr<BlockPool> pool;
  // The staging rank of the group's first channel: a shard class's group of some of a
  // receiver's ranks stages as those ranks (channel i as local rank first_rank + i).
  int first_rank = 0;
  // The engine rank of local rank 0, for messages: they name channel i as engine rank
  // engine_rank + first_rank + i, the numbering the engine's own ranks use.
  int engine_rank = 0;
};

class Group {
 public:
  Group(GroupSpec spec, std::vector<std::unique_ptr<BucketChannel>> channels, GroupOptions opts);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const GroupSpec& spec() const { return spec_; }
  int rank_count() const { return static_cast<int>(ranks_.size()); }
  const GroupOptions& options() const { return opts_; }

  // Queues `job`, or refuses it (changing nothing): 409 for an aborted group, a sequence already
  // received or queued, or a new session while the previous one's buckets are still in flight;
  // 429 for a sequence more than max_ahead beyond the next expected one. A job of a new session
  // restarts the sequence at 0.
  std::optional<Refusal> submit(const std::shared_ptr<BucketJob>& job);

  // Buckets queued or in flight.
  bool busy() const;
  // Whether this group has taken a bucket of session `session_id`.
  bool used_in(std::uint64_t session_id) const;
  bool aborted() const;
  std::string abort_reason() const;

  // Aborts the channels and fails pending jobs with `status` and `reason`. Idempotent.
  void abort(int status, const std::string& reason);

  std::uint64_t bytes_received() const;
  // How broadcasts reach the engine's first rank ("single-copy", "chain", "gloo-tree", "nccl").
  std::string data_path() const;
  std::uint64_t buckets_received() const;

 private:
  // "engine rank N" for channel r, as messages name it.
  std::string engine_rank_text(int r) const;
  struct RecvBuffer;
  struct Rank;
  struct Unpack {
    std::shared_ptr<BucketJob> job;
    int slot = 0;
    std::vector<std::optional<Digest>> digests;  // made while receiving (may be empty)
  };

  void receive_loop(int r);
  void unpack_loop(int r);
  // Digests the tensors of `job` received in `block` and stages them for their runners.
  // Digests every routed tensor, checks the digests the trainer sent (a mismatch fails the bucket
  // and the session, naming the tensor, and stages nothing), then stages.
  // `received`: digests made as the bucket was received, one per entry (or none), nullopt where
  // not made there.
  void stage_bucket(int r, BucketJob& job, std::shared_ptr<const Block> block,
                    const std::vector<std::optional<Digest>>& received);
  // A delta bucket: the base rebuilt into a pool block, the payload in `slot` applied to it, then
  // staged as above. A base this engine does not hold or a bad payload finishes the job with
  // session_failed (the group is fine).
  void apply_delta(int r, BucketJob& job, int slot);
  std::shared_ptr<BucketJob> next_job(int r, int& slot);
  void fail(int status, const std::string& reason);
  void fail_locked(int status, const std::string& reason, std::unique_lock<std::mutex>& lock);

  const GroupSpec spec_;
  const GroupOptions opts_;
  const std::shared_ptr<BlockPool> pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::shared_ptr<BucketJob>> pending_;  // by sequence
  std::uint64_t session_id_ = 0;
  bool used_ = false;
  bool stopping_ = false;
  std::string abort_reason_;
  std::uint64_t bytes_received_ = 0;
  std::uint64_t buckets_received_ = 0;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::jthread> threads_;
};

// The layout of a bucket request's tensors as the sender built it (ours aligned, SGLang's back to
// back), or a refusal (400) when it does not parse or holds more than `max_bytes`: checked
// before anything is allocated for it. Shared by the Engine and the Receiver.
std::variant<Refusal, BucketPlan> plan_bucket(const UpdateWeightsFromDistributedRequest& request,
                                              std::uint64_t sequence, std::size_t max_bytes);

// The HTTP status for a failure of kind `error` (504 for comm::TimeoutError, else 500).
int failure_status(const std::exception& error);

namespace test_hooks {
// Fault injection for tests only (a decoder bug, made on purpose): a test binary that defines this
// function gets it called with every delta bucket right after decoding, before the digests are
// checked. It is declared weak and no production source defines it, so in every other binary the
// reference is null and nothing at run time can turn it on.
[[gnu::weak]] void after_delta_decode(const BucketPlan& plan, std::span<std::byte> bucket);
}  // namespace test_hooks

}  // namespace weightcast::sync::engine

// send_buckets(): the data phase of one pipeline stage — its tensors, cut into buckets, each
// announced to every engine over HTTP and broadcast once on the stage's group.
//
// Delta updates (options.delta): the packer thread also encodes each bucket against the stage's
// base; a bucket's request then says how it travels, so it is sent once the bucket is encoded:
// right after the previous broadcast (the packer encoded it meanwhile), before any pause, so the
// engines still post each receive before the source goes quiet. The broadcast carries the
// payload, or the bucket where the delta did not pay.
// Pipelining, so that neither HTTP nor packing serializes with the wire:
//   - a packer thread fills buffer k+1 while bucket k is broadcast (BucketPacker, two buffers
//     reused across updates); a bucket that is one tensor as it is, and every tensor of the
//     per-tensor format in host memory, is broadcast straight from the caller's bytes;
//   - the request for bucket k+1 is sent to every engine before bucket k is broadcast; requests
//     run asynchronously, at most `max_in_flight` unanswered per engine, so a bucket's request
//     never waits for the previous bucket's broadcast to finish on the engines;
//   - the broadcast itself runs on the calling thread.
// The engines receive buckets strictly in sequence order, so requests overtaking each other is
// harmless. Any failure — an engine call, the broadcast, the packer, the deadline — stops the
// phase: the communicator is aborted (so no one waits for a bucket that will not come), the
// answers still in flight are collected for at most `failure_grace`, and the result lists every
// failure. The communicator is then unusable; the group must be created again.
// Threading: call from one thread; it uses one extra thread for packing and one per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "sync/model/atomic_groups.h"
#include "sync/trainer/delta_source.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/packer.h"
#include "sync/trainer/report.h"
#include "sync/trainer/session.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

inline constexpr std::size_t kDefaultBucketBytes = std::size_t{512} << 20;

struct BucketSendOptions {
  std::size_t bucket_bytes = kDefaultBucketBytes;     // a larger tensor travels alone
  std::size_t max_in_flight = 2;                      // unanswered bucket requests per engine, >= 1
  comm::MemoryKind memory = comm::MemoryKind::kHost;  // kCuda: staged through a device buffer
  comm::Millis timeout{300000};                       // the whole phase
  comm::Millis failure_grace{5000};  // after a failure, wait this long for other answers
  comm::Millis bucket_delay{0};      // sleep after each broadcast: simulates a slow link (tests)
  // kWeightcastBucket: our aligned bucket, one broadcast each. SGLang's formats (common mode):
  // tensors back to back, one broadcast per bucket (kFlattenedBucket) or per tensor
  // (kPerTensor); use max_in_flight = 1 with them, as SGLang serializes bucket requests.
  LoadFormat load_format = LoadFormat::kWeightcastBucket;
  // Where packed buckets are built; null: the process's pool (default_pack_buffers()).
  std::shared_ptr<PackBuffers> pack_buffers;
  // Delta updates (kWeightcastBucket only): the stage's base, kept up to date with every bucket
  // sent; buckets go out as deltas against it when the session's delta_base() is its version.
  // Null: every bucket in full and no base kept. Must outlive the call.
  DeltaSource* delta = nullptr;
  // Tensors whose bytes are still being produced while earlier buckets go out (the trainer's TP
  // gather, launcher/train/stage_gather.h): called with a tensor's name, on the thread about to
  // read its bytes (the packer's, the one digesting our format's buckets ahead of the sends, or
  // the sender's for unpacked sends; so from two threads at once), and returns once they are
  // all there; throws to fail the send. Null: every tensor's bytes are there at the call.
  std::function<void(const std::string& name, comm::Deadline deadline)> await_tensor;
  // Tensors an engine loads together (sync/model/atomic_groups.h) stay in one bucket; a group
  // larger than bucket_bytes fails the send with comm::ConfigError. Unset: no groups.
  std::optional<GroupRule> atomic_groups;
  // Polled before each bucket (by the chain's and the colocated sender alike): true ends the
  // phase there, as a failure of the tensors' source ("interrupted"), and the caller aborts.
  // Python's Ctrl-C sets it. Null: never.
  std::function<bool()> stop_requested;
};

struct BucketSendResult {
  bool ok = true;
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;  // tensor bytes, without padding
  std::uint64_t buckets = 0;
  std::uint64_t wire_bytes = 0;     // broadcast: full buckets with padding, delta payloads
  std::uint64_t delta_buckets = 0;  // buckets sent as deltas
  double seconds = 0;
  double http_wait_seconds = 0;  // waiting for bucket answers
  double pack_wait_seconds = 0;  // waiting for the packer
  double broadcast_seconds = 0;
  double hash_wait_seconds = 0;  // waiting for the digests a bucket's request carries
  std::vector<EngineFailure> failures;
  std::string error;  // the first non-engine failure (broadcast, packer, deadline), if any
  // That failure began on this side, outside the data plane (packing, encoding, the tensors'
  // source): it is no evidence against any engine.
  bool source_fault = false;
  std::string delta_change;  // DeltaSource::change() of this update (--delta auto changed its mind)
  std::string data_path;     // comm::Communicator::data_path() of the group it went on
};

// Whether `options` asks the phase to stop before bucket `k`; if so, `result` says why.
bool stop_requested(const BucketSendOptions& options, std::uint64_t k, BucketSendResult& result);

// `other`, sent beside `into` at the same time on another group or path, added to it: counts and
// waits add up, the time is the longer one, failures join, the first error stays, and another
// data path is appended ("single-copy+colocated").
void merge_parallel(BucketSendResult& into, BucketSendResult other);

// The tensors of one send indexed by name into `by_name` (unique names, bytes of the declared
// size: EnforceError otherwise), their count and bytes added to `result`; returns their metas, in
// order. The senders' (send_buckets(), sync/trainer/colocated_sender.h) one check of their input.
std::vector<TensorMeta> index_tensors(std::span<const NamedTensor> tensors,
                                      std::unordered_map<std::string, const NamedTensor*>& by_name,
                                      BucketSendResult& result);

// The buckets send_buckets() cuts `metas` into with `options`.
std::vector<BucketPlan> plan_send(std::span<const TensorMeta> metas,
                                  const BucketSendOptions& options);
// Faults in, now, the pack buffers send_buckets() will take for `metas` (the pool of
// options.pack_buffers or the default one), so the first update does not pay for them.
void reserve_send_buffers(std::span<const TensorMeta> metas, const BucketSendOptions& options);

// Sends `tensors` (unique names, bytes of the declared size: EnforceError otherwise) in order on
// group `group_name`, where this process is rank 0 of `comm`. Engine and data-plane failures are
// returned, not thrown. `members`: engine i of `engines` is member members[i] of the session
// (UpdateSession::session_id); empty: member i.
BucketSendResult send_buckets(const UpdateSession& session, const std::string& group_name,
                              comm::Communicator& comm, std::span<EngineApi* const> engines,
                              std::span<const NamedTensor> tensors,
                              const BucketSendOptions& options,
                              std::span<const std::size_t> members = {});

}  // namespace weightcast::sync::trainer

// ColocatedSender: the data phase of one stage for the engines on this process's host — the
// colocated path (docs/colocated.md). Beside send_buckets() (the chain), not instead of it: an
// update sends to its same-host engines here and to the others on the group, at the same time.
//
// Each bucket (planned as send_buckets() plans it) goes out from where its tensors lie when they
// all lie in one live segment already (a TensorArena made shared: comm::colocate::find_shared),
// with nothing copied; else it is laid out once in one of two sealed memfd segments of the
// sender's (comm/colocate/segment.h), each tensor copied in and hashed in one pass, chunk by
// chunk while the chunk is in cache. Every colocated engine is then sent
// POST /update_weights_from_tensor (UpdateSession::segment_request: the session's selector,
// version and that engine's session id) naming its own abstract socket, on which this sender
// hands the segment's read-only descriptor, with that engine's session id as the handle's token,
// to each of the engine's ranks that asks, until the engine answered. Double buffered: bucket k+1
// is packed into the other segment while the engines copy bucket k out; a segment is written
// again only after every engine answered for the bucket it held.
// Failures (an engine's refusal or silence, the deadline, the tensors' source) stop the phase and
// come back in the result as send_buckets()'s do; the engines then hold nothing of the bucket
// (an engine stages a bucket whole or not at all), and the caller runs the abort path.
// No segment outlives the sender, and none has a name in /dev/shm; the kernel reclaims them if
// this process dies.
// With ColocateMemory::kCuda the buckets travel in device memory instead (docs/colocated.md, "On
// GPUs"): each is packed and hashed as above, then written to one of two device segments of the
// sender's (comm/colocate/cuda_ipc.h, on the packer thread's current device), and the request
// carries that segment's CUDA IPC handle: no socket, no descriptor; the engine opens, copies and
// closes it before answering.
// Lifetime: one per stage source, kept between updates (segments and sockets are reused).
// Threading: one caller at a time; send() uses one packer thread and, per engine and bucket, two
// threads (the request and its socket) or, with kCuda, one (the request).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "comm/colocate/segment_server.h"
#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/colocated_segments.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/session.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

// Which engines take the colocated path (UpdaterOptions::colocate, weightcast-train --colocate).
// kOff: none, every engine is on the chain. kOn: every engine on this host that offers it
// (/server_info's colocate_host equals comm::host_identity()); none offering it is a
// comm::ConfigError. kAuto (the default): as kOn with the Gloo backend, but with none the chain
// alone, without an error; with NCCL every engine stays on the chain.
enum class ColocateMode { kOff, kOn, kAuto };
std::string_view to_string(ColocateMode mode);
// "off", "on" or "auto"; comm::ConfigError otherwise.
ColocateMode parse_colocate_mode(std::string_view text);

struct ColocatedEngine {
  EngineApi* engine = nullptr;
  std::size_t member = 0;  // its index among the session's members (UpdateSession::session_id)
};

class ColocatedSender {
 public:
  // `device`: kCuda's CUDA device, resolved by the caller (comm::cuda_resolve_device): the
  // packer is a thread of its own, whose current device is always 0.
  explicit ColocatedSender(ColocateMemory memory = ColocateMemory::kHost, int device = 0)
      : segments_(memory, device) {}
  ColocatedSender(const ColocatedSender&) = delete;
  ColocatedSender& operator=(const ColocatedSender&) = delete;

  // Sends `tensors` (unique names, bytes of the declared size: EnforceError otherwise) to
  // `engines` with options.bucket_bytes, options.atomic_groups, options.timeout (the whole
  // phase), options.await_tensor and options.bucket_delay; the other options are the chain's.
  // Failures are returned.
  BucketSendResult send(const UpdateSession& session, std::span<const ColocatedEngine> engines,
                        std::span<const NamedTensor> tensors, const BucketSendOptions& options);

 private:
  friend class ColocatedSend;
  // The socket engine `engine` fetches handles on (made at its first bucket).
  comm::colocate::SegmentServer& server_for(const EngineApi* engine);

  std::map<const EngineApi*, std::unique_ptr<comm::colocate::SegmentServer>> servers_;
  ColocatedSegments segments_;  // where the buckets are laid out
};

// The colocated send of a stage, which ran beside the chain's `chain`, folded into it: one
// update, one result; the tensors are the same, the bytes moved add up.
void merge_beside(BucketSendResult& chain, BucketSendResult colocated);

}  // namespace weightcast::sync::trainer

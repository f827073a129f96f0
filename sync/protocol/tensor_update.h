// POST /update_weights_from_tensor: the colocated path's bucket request (docs/colocated.md).
//
// SGLang and Miles send `serialized_named_tensors` (torch-pickled, one entry per engine TP rank)
// with load_format "flattened_bucket"; unpickling runs code, so weightcast-engine never reads
// that form and refuses it with a 400 that says what to send instead. weightcast's own form is a
// JSON manifest in the shape of SGLang's flattened_bucket — per tensor its name, dtype, shape and
// byte offset in one segment — plus a segment handle: the abstract unix socket the trainer serves
// the segment's read-only memfd on (comm/colocate/handle_exchange.h), or on GPUs the segment's
// CUDA IPC memory handle (comm/colocate/cuda_ipc.h, 128 hex digits), and the segment's size.
// Nothing in it is deserialized as code. Fields:
//   load_format "weightcast_segment" (required), segment {"socket" or "cuda_ipc", "size"},
//   manifest [{"name",
//   "dtype", "shape", "offset"}], digests (one per tensor, XXH3-128 hex), and as for
//   update_weights_from_distributed: selector, session_id, weight_version, flush_cache,
//   abort_all_requests.
// Checks (comm::BadRequestError naming the field): every tensor's bytes lie inside the segment,
// no two overlap, names are unique, one digest per tensor.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/protocol_limits.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

inline constexpr std::string_view kSegmentLoadFormat = "weightcast_segment";

// Exactly one of `socket` and `cuda_ipc` is set.
struct SegmentHandle {
  std::string socket;  // abstract AF_UNIX name (no leading NUL) the trainer serves the fd on
  std::uint64_t size = 0;
  std::string cuda_ipc;  // a CUDA IPC memory handle of a device segment, as 128 hex digits
};

struct UpdateWeightsFromTensorRequest {
  SegmentHandle segment;
  std::vector<TensorMeta> tensors;
  std::vector<std::uint64_t> offsets;  // parallel to tensors: byte offset in the segment
  std::vector<std::string> digests;    // parallel to tensors
  std::optional<Selector> selector;
  std::optional<std::string> session_id;
  std::optional<std::string> weight_version;
  bool flush_cache = true;
  bool abort_all_requests = false;
};

UpdateWeightsFromTensorRequest parse_update_weights_from_tensor(std::string_view body,
                                                                const ProtocolLimits& limits);
// A bucket already in this process's memory (`size` bytes): what a Python receiver decoded from
// the pickled form, opted in (python/weightcast/pickled.py). Reads `manifest` and the session
// fields as above, no segment and no digests; the same layout checks against `size`.
UpdateWeightsFromTensorRequest parse_local_bucket(std::string_view body, std::uint64_t size,
                                                  const ProtocolLimits& limits);
// The body the trainer sends (parse_update_weights_from_tensor reads it back unchanged).
std::string to_json_string(const UpdateWeightsFromTensorRequest& request);

}  // namespace weightcast::sync

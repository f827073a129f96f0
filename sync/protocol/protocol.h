// The request bodies of the engine HTTP API (the route table in the design notes), with the
// functions that read and write them. Response bodies are in sync/protocol/protocol_responses.h,
// included here so one include gives the whole protocol.
//
// Field names are SGLang's (python/sglang/srt/managers/io_struct.py), so a trainer written for
// SGLang can drive a weightcast engine and the reverse. Our extensions: begin/end_weight_update,
// the bucket request's selector, optional sequence and "weightcast_bucket" load format, and
// init's optional rendezvous. What SGLang and Miles send parses unchanged (docs/protocol.md,
// "Compatibility").
//
// Pairing: for each body X there is exactly one reader, parse_<route>(std::string_view body,
// limits), and one writer, to_json_string(const X&). The engine server parses what the trainer
// client wrote with the same pair, so parse(to_json_string(x)) == x for every valid x. Parsing is
// strict: a missing required field, a wrong JSON type, an unknown selector/dtype/backend/mode, a
// value out of range, mismatched list lengths or a limit exceeded throws comm::BadRequestError
// whose message starts with the field's path ("shapes[3][1]: must be >= 0 (got -2)"); the
// server answers it with a 400. Unknown fields are ignored, as SGLang ignores them.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/dtype.h"
#include "sync/protocol/protocol_enums.h"
#include "sync/protocol/protocol_limits.h"
#include "sync/protocol/protocol_responses.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

// SGLang's default group_name for init/destroy_weights_update_group and the bucket request.
inline constexpr std::string_view kDefaultGroupName = "weight_update_group";
// Longest master_address accepted (a DNS name is at most 253 bytes).
inline constexpr std::size_t kMaxAddressLength = 255;

// POST /init_weights_update_group (SGLang InitWeightsUpdateGroupReqInput).
struct InitWeightsUpdateGroupRequest {
  std::string master_address;
  int master_port = 0;  // 1..65535
  int rank_offset = 0;  // in [1, world_size): rank 0 is the trainer's source
  int world_size = 0;   // >= 1; with the rank_offset rule, >= 2 in practice
  std::string group_name = std::string(kDefaultGroupName);
  Backend backend = Backend::kNccl;
  std::optional<Rendezvous> rendezvous =
      std::nullopt;  // ours; absent (SGLang/Miles): the engine detects it
  // Shard-aware broadcast (docs/sharding.md): the engine ranks that join, ascending, ranks[i] at
  // group rank rank_offset + i; the engine's other ranks stay out of the group and answer its
  // buckets without receiving. Empty: every rank joins, at rank_offset + its engine rank.
  std::vector<int> ranks = {};
  bool operator==(const InitWeightsUpdateGroupRequest&) const = default;
};

// POST /destroy_weights_update_group (SGLang DestroyWeightsUpdateGroupReqInput).
struct DestroyWeightsUpdateGroupRequest {
  std::string group_name = std::string(kDefaultGroupName);
  bool operator==(const DestroyWeightsUpdateGroupRequest&) const = default;
};

// POST /pause_generation (SGLang PauseGenerationReqInput; mode defaults to "abort" there too).
struct PauseGenerationRequest {
  PauseMode mode = PauseMode::kAbort;
  bool operator==(const PauseGenerationRequest&) const = default;
};

// POST /continue_generation (SGLang ContinueGenerationReqInput). The body may be empty.
struct ContinueGenerationRequest {
  bool torch_empty_cache = true;
  bool operator==(const ContinueGenerationRequest&) const = default;
};

// GET or POST /flush_cache: no fields; the body may be empty.
struct FlushCacheRequest {
  bool operator==(const FlushCacheRequest&) const = default;
};

// POST /begin_weight_update (ours): opens a session over the runners `selector` covers.
// `holder` (optional) describes the client ("host:pid group name"); a client that names itself
// owns the session: every later session call must carry the session_id the answer returns, and
// calls without it are refused while the session is open (docs/protocol.md, "Session owners").
// A holder also takes a lease on the engine (sync/engine/control/lease.h): later begins carry the
// lease_id the first answer returned; lease_ttl_s asks for a time to live (absent: the engine's
// --lease-ttl-s).
// Ours: begin_weight_update's "lora" object, an adapter update (docs/lora.md): `lora_name`, PEFT's
// `config` (an object, kept as JSON text: the engine checks it) and `op` "load" (refused for a
// held name) or "upsert".
struct LoraBegin {
  std::string name;
  std::string config_json;
  bool upsert = false;
  bool operator==(const LoraBegin&) const = default;
};

struct BeginWeightUpdateRequest {
  Selector selector = Selector::kAll;  // required on the wire
  std::optional<std::string> holder = std::nullopt;
  std::optional<std::string> lease_id = std::nullopt;
  std::optional<std::uint64_t> lease_ttl_s = std::nullopt;  // 1 .. 86400
  std::optional<LoraBegin> lora = std::nullopt;
  bool operator==(const BeginWeightUpdateRequest&) const = default;
};

// POST /unload_lora_adapter (SGLang's route and body): {"lora_name"}.
struct UnloadLoraAdapterRequest {
  std::string lora_name;
};
UnloadLoraAdapterRequest parse_unload_lora_adapter(std::string_view body,
                                                   const ProtocolLimits& limits);

// Ours: a bucket that travels as a delta against the bytes the engine committed at `base_version`
// (update_weights_from_distributed's "delta" object; docs/protocol.md, "Delta buckets"). The
// broadcast carries `wire_bytes` of payload instead of the bucket; the engine rebuilds the base
// bucket from its committed tensors, checks each against base_digests (XXH3-128, 32 hex digits,
// parallel to the tensors) and applies the payload into staging. Only with kWeightcastBucket.
struct BucketDelta {
  DeltaCodec codec = DeltaCodec::kXorZstd;
  std::uint64_t wire_bytes = 0;  // >= 1, <= limits.max_bucket_bytes
  std::string base_version;
  std::vector<std::string> base_digests;
  bool operator==(const BucketDelta&) const = default;
};

// POST /update_weights_from_distributed: one bucket (SGLang UpdateWeightsFromDistributedReqInput
// plus our fields). On the wire the tensors are SGLang's parallel lists names / dtypes / shapes;
// here they are one list of TensorMeta. Differences from SGLang: selector is ours and required;
// sequence is ours and optional (absent: the next bucket in arrival order); load_format is one
// of LoadFormat (absent: one broadcast per tensor, as SGLang's default path); names must be
// non-empty, unique within the bucket and valid tensor names. The total size is derived from
// the shapes, never sent. selector is optional since slime and plain SGLang clients send none:
// inside a session the session's selector applies; with no session open the request is a
// sessionless update (docs/protocol.md, "Sessionless updates").
struct UpdateWeightsFromDistributedRequest {
  std::vector<TensorMeta> tensors;  // wire: names, dtypes, shapes
  std::string group_name = std::string(kDefaultGroupName);
  std::optional<Selector> selector = std::nullopt;
  std::optional<std::uint64_t> sequence = std::nullopt;  // bucket number within the session, from 0
  LoadFormat load_format = LoadFormat::kWeightcastBucket;
  bool flush_cache = true;
  bool abort_all_requests = false;
  std::optional<std::string> weight_version;             // SGLang: Optional[str], null = absent
  bool torch_empty_cache = false;                        // SGLang field; accepted and carried
  std::optional<std::string> session_id = std::nullopt;  // ours: the owner's session
  std::optional<BucketDelta> delta = std::nullopt;       // ours: absent = the bucket in full
  // Ours, optional: XXH3-128 (32 hex digits) of each tensor's new bytes, parallel to the tensors,
  // for full and delta buckets alike; the engine checks them once the bucket is decoded, before
  // staging (docs/protocol.md, "Digests of the new bytes"). Empty: not sent (SGLang, Miles).
  std::vector<std::string> digests;
  bool operator==(const UpdateWeightsFromDistributedRequest&) const = default;

  // Sum of the tensors' byte counts, unpadded (bucket layout and alignment belong to the data
  // path). Checked: throws comm::BadRequestError on overflow.
  std::size_t total_bytes() const;
};

// POST /update_weight_version (SGLang UpdateWeightVersionReqInput; abort_all_requests defaults
// to true there too).
struct UpdateWeightVersionRequest {
  std::string new_version;
  bool abort_all_requests = true;
  std::optional<std::string> session_id = std::nullopt;  // ours: the owner's session
  bool operator==(const UpdateWeightVersionRequest&) const = default;
};

// POST /end_weight_update (ours): the body may be empty (an id-less client).
struct EndWeightUpdateRequest {
  std::optional<std::string> session_id = std::nullopt;
  bool operator==(const EndWeightUpdateRequest&) const = default;
};

// POST /abort_weight_update (ours): drops the open session. `force` aborts a session whatever
// its owner (an operator's tool: it needs the engine's token where one is configured).
struct AbortWeightUpdateRequest {
  std::optional<std::string> session_id = std::nullopt;
  bool force = false;
  bool operator==(const AbortWeightUpdateRequest&) const = default;
};

// POST /release_weight_update_lease (ours): ends the engine's lease (sync/engine/control/lease.h),
// by its id, or with `force` whatever its holder (an operator's tool: the engine's token where one
// is configured).
struct ReleaseLeaseRequest {
  std::optional<std::string> lease_id = std::nullopt;
  bool force = false;
  bool operator==(const ReleaseLeaseRequest&) const = default;
};

// POST /weights_checker (SGLang's): "checksum" answers per-runner digests; "snapshot" records
// them; "compare" checks the resident bytes against the snapshot.
struct WeightsCheckerRequest {
  std::string action;
  bool operator==(const WeightsCheckerRequest&) const = default;
};

InitWeightsUpdateGroupRequest parse_init_weights_update_group(std::string_view body,
                                                              const ProtocolLimits& limits = {});
DestroyWeightsUpdateGroupRequest parse_destroy_weights_update_group(
    std::string_view body, const ProtocolLimits& limits = {});
PauseGenerationRequest parse_pause_generation(std::string_view body,
                                              const ProtocolLimits& limits = {});
ContinueGenerationRequest parse_continue_generation(std::string_view body,
                                                    const ProtocolLimits& limits = {});
FlushCacheRequest parse_flush_cache(std::string_view body, const ProtocolLimits& limits = {});
BeginWeightUpdateRequest parse_begin_weight_update(std::string_view body,
                                                   const ProtocolLimits& limits = {});
// Also checks every tensor's byte count and their sum against limits.max_bucket_bytes, and the
// number of names against limits.max_names_per_bucket, so the receiver may allocate total_bytes().
UpdateWeightsFromDistributedRequest parse_update_weights_from_distributed(
    std::string_view body, const ProtocolLimits& limits = {});
UpdateWeightVersionRequest parse_update_weight_version(std::string_view body,
                                                       const ProtocolLimits& limits = {});
EndWeightUpdateRequest parse_end_weight_update(std::string_view body,
                                               const ProtocolLimits& limits = {});
AbortWeightUpdateRequest parse_abort_weight_update(std::string_view body,
                                                   const ProtocolLimits& limits = {});
ReleaseLeaseRequest parse_release_lease(std::string_view body, const ProtocolLimits& limits = {});
WeightsCheckerRequest parse_weights_checker(std::string_view body,
                                            const ProtocolLimits& limits = {});

std::string to_json_string(const InitWeightsUpdateGroupRequest& request);
std::string to_json_string(const DestroyWeightsUpdateGroupRequest& request);
std::string to_json_string(const PauseGenerationRequest& request);
std::string to_json_string(const ContinueGenerationRequest& request);
std::string to_json_string(const FlushCacheRequest& request);
std::string to_json_string(const BeginWeightUpdateRequest& request);
std::string to_json_string(const UpdateWeightsFromDistributedRequest& request);
std::string to_json_string(const UpdateWeightVersionRequest& request);
std::string to_json_string(const EndWeightUpdateRequest& request);
std::string to_json_string(const AbortWeightUpdateRequest& request);
std::string to_json_string(const ReleaseLeaseRequest& request);
std::string to_json_string(const WeightsCheckerRequest& request);

}  // namespace weightcast::sync

// The response bodies of the engine HTTP API, with their readers and writers; included by
// sync/protocol/protocol.h (see there for the parse/to_json_string pairing and the error rules).
//
// Every response is {"success": bool, "message": str, ...}. Errors (4xx/5xx) and the routes that
// return nothing else use BasicResponse; the rest add route-specific fields. The trainer client
// reads engine responses with these same parse functions, so an engine that answers outside the
// schema is caught at the client instead of being half-understood.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/dtype.h"
#include "sync/protocol/protocol_enums.h"
#include "sync/protocol/protocol_limits.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync {

// Any error response, and the success response of init/destroy_weights_update_group,
// pause/continue_generation, flush_cache, update_weights_from_distributed,
// update_weight_version and health. "message" may be absent on the wire (reads as "").
struct BasicResponse {
  bool success = true;
  std::string message;
  bool operator==(const BasicResponse&) const = default;
};

// POST /begin_weight_update: the selector the session recorded.
// session_id: the id every later call of this session carries (empty from engines that issue
// none); holder: who the session belongs to, as the request named it (empty: nobody named);
// weight_version: the version committed before this session (what a delta would start from).
struct BeginWeightUpdateResponse {
  bool success = true;
  std::string message;
  Selector selector = Selector::kAll;
  std::string session_id;
  std::string holder;
  std::string weight_version;
  // Ours: the digest of the covered runners' committed weights (their per-tensor digests,
  // combined), so a trainer can tell an engine that still holds exactly what the last update
  // committed from one that restarted or was written behind its back (delta updates). Empty: not
  // sent (engines that are not ours).
  std::string runner_digest;
  // Ours: the lease this begin took or renewed (a client that named a holder;
  // sync/engine/control/lease.h) and its time to live. Empty / 0: no lease (id-less clients,
  // engines that are not ours).
  std::string lease_id;
  std::uint64_t lease_ttl_s = 0;
  // Ours, adapter sessions: the adapter the engine holds under the session's lora_name, its
  // version and digest (Adapter::combined_digest), so a trainer can send it deltas against it
  // (docs/lora.md). Empty: none held, or the engine keeps no copy (the SGLang plug-in hands its
  // adapter over).
  std::string lora_version;
  std::string lora_digest;
  bool operator==(const BeginWeightUpdateResponse&) const = default;
};

// What end_weight_update did to one covered runner. tensors_transformed > tensors_loaded means
// post-load processing touched tensors this session did not load (the compatibility mode that
// reproduces the double-shuffle bug).
struct RunnerUpdateStats {
  Runner runner = Runner::kTarget;
  std::uint64_t tensors_loaded = 0;
  std::uint64_t tensors_transformed = 0;
  bool operator==(const RunnerUpdateStats&) const = default;
};

// POST /end_weight_update: the committed version and one entry per covered runner.
struct EndWeightUpdateResponse {
  bool success = true;
  std::string message;
  std::string weight_version;
  std::vector<RunnerUpdateStats> runners;  // unique runners
  // Ours: runner_digest (as in BeginWeightUpdateResponse) after the commit. Empty: not sent.
  std::string runner_digest;
  // Ours, adapter sessions: the digest of the adapter swapped in (as lora_digest at begin).
  std::string lora_digest;
  bool operator==(const EndWeightUpdateResponse&) const = default;
};

// One runner of an engine: the name patterns it loads and its post-load layout transform.
struct RunnerInfo {
  Runner name = Runner::kTarget;
  std::vector<std::string> filters;  // non-empty strings; their syntax belongs to the engine
  std::string layout;                // "none", or the name of a layout transform
  std::uint64_t tensor_count = 0;    // resident tensors
  // Seed of the generated initial weights (what a verifier starts its mirror from); nullopt for
  // weights read from a file.
  std::optional<std::uint64_t> seed;
  bool operator==(const RunnerInfo&) const = default;
};

// GET /server_info: capabilities and state. SGLang's server_info is a dump of its server
// arguments; we keep the fields trainers read from it (tp_size, weight_version,
// speculative_algorithm) under the same names and add ours.
struct ServerInfoResponse {
  bool success = true;
  std::string message;
  std::string version;              // weightcast version of the engine
  std::vector<RunnerInfo> runners;  // unique names
  std::vector<Selector> selectors;  // selectors begin_weight_update accepts
  std::vector<Backend> backends;    // data-plane backends this build supports
  int rank_count = 1;               // ranks the engine adds to a weight update group (>= 1)
  int tp_size = 1;                  // >= 1
  std::string weight_version;       // of the committed weights
  std::optional<std::string> speculative_algorithm;  // null when off
  std::optional<Selector> session_selector;          // null when no session is open
  // The engine takes colocated buckets (POST /update_weights_from_tensor, docs/colocated.md)
  // from trainers whose comm::host_identity() is this; absent: it takes none.
  std::optional<std::string> colocate_host;
  // The engine takes adapter sessions (docs/lora.md): its answer lists the adapters it holds
  // under lora_adapters (an engine that takes none has no such key).
  bool lora = false;
  // Shard-aware broadcast (docs/sharding.md): what each engine rank keeps of each HF tensor, one
  // plan per rank (rank i's at index i), each the JSON text of sync/model/shard_plan.h's form.
  // Empty: the engine announces none. Present: exactly rank_count plans (else BadRequestError).
  std::vector<std::string> shard_plans;
  bool operator==(const ServerInfoResponse&) const = default;
};

// One tensor of a runner in GET /weights_checksum?runner=... . `digest` is lower-case hex.
struct TensorChecksum {
  std::string name;
  std::string digest;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  bool operator==(const TensorChecksum&) const = default;
};

struct WeightsChecksumResponse {
  bool success = true;
  std::string message;
  Runner runner = Runner::kTarget;
  std::string weight_version;
  std::string digest;                   // combined over `tensors`, lower-case hex
  std::vector<TensorChecksum> tensors;  // unique names
  bool operator==(const WeightsChecksumResponse&) const = default;
};

// Longest digest accepted, in hex characters (a 512-bit hash).
inline constexpr std::size_t kMaxDigestHexLength = 128;

// GET /spec_accept_length: the speculative accept-length probe (sync/model/spec_probe.h) on the
// committed weights: mean accepted draft tokens + 1 per round, in [1, draft_tokens + 1].
struct SpecAcceptLengthResponse {
  bool success = true;
  std::string message;
  double accept_length = 1.0;
  std::int64_t draft_tokens = 0;
  std::string weight_version;
  bool operator==(const SpecAcceptLengthResponse&) const = default;
};

BasicResponse parse_basic_response(std::string_view body, const ProtocolLimits& limits = {});
SpecAcceptLengthResponse parse_spec_accept_length_response(std::string_view body,
                                                           const ProtocolLimits& limits = {});
BeginWeightUpdateResponse parse_begin_weight_update_response(std::string_view body,
                                                             const ProtocolLimits& limits = {});
EndWeightUpdateResponse parse_end_weight_update_response(std::string_view body,
                                                         const ProtocolLimits& limits = {});
ServerInfoResponse parse_server_info_response(std::string_view body,
                                              const ProtocolLimits& limits = {});
WeightsChecksumResponse parse_weights_checksum_response(std::string_view body,
                                                        const ProtocolLimits& limits = {});

std::string to_json_string(const BasicResponse& response);
std::string to_json_string(const BeginWeightUpdateResponse& response);
std::string to_json_string(const SpecAcceptLengthResponse& response);
std::string to_json_string(const EndWeightUpdateResponse& response);
std::string to_json_string(const ServerInfoResponse& response);
std::string to_json_string(const WeightsChecksumResponse& response);

}  // namespace weightcast::sync

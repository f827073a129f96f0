// Telling engines apart by their GET /server_info answer (docs/protocol.md, "vLLM's dialect"),
// and reading the `weightcast` key with which a weightcast receiver announces itself inside
// another engine (the SGLang plug-in, the torch reference engine).
//
//   - vLLM (dev mode) answers {"vllm_config": <str or object>, "vllm_env", "system_env"};
//   - weightcast-engine and engines serving our routes answer our schema, with "success";
//   - SGLang answers its ServerArgs dump (tp_size, ..., no "success"); older SGLang serves only
//     /get_server_info (the caller falls back on a 404).
// The announce: {"weightcast": {"version": str, "receiver": str, "native_routes": bool,
// "runners": [RunnerInfo...]}} at the top level of the answer, or (SGLang, where the plug-in's
// hook adds it to the scheduler's internal state) in any element of "internal_states".
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/protocol.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::sync::trainer {

struct ReceiverAnnounce {
  std::string version;              // the weightcast package's version inside the engine
  std::string receiver;             // e.g. "weightcast.Receiver"
  bool native_routes = false;       // the server also serves weightcast's own routes
  std::vector<RunnerInfo> runners;  // empty when the engine does not describe them
  std::vector<std::string> routes;  // extra weightcast routes served (e.g. "/weights_checksum")
};

// The flavor a 2xx /server_info body says: kVllm with "vllm_config"; kWeightcast with "success"
// or an announce that says native_routes; kSglang for any other JSON object.
// comm::BadRequestError when the body is not a JSON object.
EngineFlavor flavor_of_server_info(std::string_view body);

// The announce in a /server_info or /get_server_info body, if any. comm::BadRequestError when a
// `weightcast` key is there but malformed (a receiver that announces itself must do it right).
std::optional<ReceiverAnnounce> read_receiver_announce(std::string_view body,
                                                       const ProtocolLimits& limits);

}  // namespace weightcast::sync::trainer

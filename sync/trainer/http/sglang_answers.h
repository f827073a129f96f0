// Reading SGLang's HTTP answers (docs/protocol.md, "Compatibility"): the shapes an SGLang server
// gives where weightcast-engine gives its strict {"success", "message", ...} JSON.
//   - init / destroy / update_weights_from_distributed / update_weight_version: {"success",
//     "message", ...}; pause / continue: {"message", "status"}; flush_cache: plain text; health:
//     an empty body. Success is the HTTP status alone, as Miles judges it: any 2xx (SGLang
//     answers failures with 400).
//   - /get_server_info: the ServerArgs dump (tp_size, speculative_algorithm, weight_version, ...).
//   - /get_weight_version and /model_info: {"weight_version", ...}.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sync/protocol/protocol.h"

namespace weightcast::sync::trainer {

// The outcome of a 2xx answer: always success (the status decides, not the body); message is
// the "message" field, else the (bounded) text itself.
BasicResponse read_sglang_answer(std::string_view body);

// The ServerInfoResponse a weightcast trainer needs, from SGLang's /get_server_info: rank_count =
// tp_size, every selector (Miles' begin_weight_update takes all three), both backends, no
// runners (SGLang does not describe them), its weight_version and speculative_algorithm.
// comm::BadRequestError when the body is not a JSON object or tp_size is not a positive integer.
ServerInfoResponse read_sglang_server_info(std::string_view body, const ProtocolLimits& limits);

// "weight_version" of a JSON object answer, if present as a string or an integer.
std::optional<std::string> read_sglang_weight_version(std::string_view body);

}  // namespace weightcast::sync::trainer

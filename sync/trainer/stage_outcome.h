// StageOutcome: what one pipeline stage's source sent in a session (its bucket-send result and,
// when verifying, the digests of what it sent), and its text form, which the stage sources
// move to the coordinator (weightcast-train over MPI, the Python package over the user's own
// collective). The JSON object form lets a caller add fields of its own around it.
// Lifetime/threading: plain values and pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/verify.h"

namespace weightcast::sync::trainer {

struct StageOutcome {
  bool sent = false;  // false: the stage did not send (an earlier failure, or a local error)
  std::string error;  // a local failure before or around sending
  BucketSendResult result;
  std::vector<SentDigest> digests;  // with --verify
};

nlohmann::json stage_outcome_json(const StageOutcome& outcome);
// Throws nlohmann::json::exception (or comm::BadRequestError from the digests) on an object
// stage_outcome_json() did not produce.
StageOutcome stage_outcome_from_json(const nlohmann::json& j);

std::string to_text(const StageOutcome& outcome);
// Throws comm::BadRequestError on text to_text() did not produce.
StageOutcome parse_stage_outcome(std::string_view text);

}  // namespace weightcast::sync::trainer

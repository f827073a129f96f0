// Messages the stage sources of weightcast-train exchange over MPI: each stage's outcome (its
// bucket-send result and, when verifying, the digests of what it sent), in a text form small
// enough for comm::mpi::broadcast_string.
// Lifetime/threading: plain values and pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/verify.h"

namespace weightcast::launcher::train {

struct StageOutcome {
  bool sent = false;  // false: the stage did not send (an earlier failure, or a local error)
  std::string error;  // a local failure before or around sending
  sync::trainer::BucketSendResult result;
  std::vector<sync::trainer::SentDigest> digests;  // with --verify
};

std::string to_text(const StageOutcome& outcome);
// Throws comm::BadRequestError on text to_text() did not produce.
StageOutcome parse_stage_outcome(std::string_view text);

}  // namespace weightcast::launcher::train

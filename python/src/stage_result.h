// StageResult: what one pipeline stage's source sent in a session (send_stage), as a value the
// user's own collective moves to the coordinator (pickled by torch.distributed's object
// collectives or mpi4py; the state is one JSON text, so any transport that moves a str works).
//
// The coordinator's finish() adds every stage's result to its report in stage order; a stage
// that failed (a local error before or around sending, or an engine / data-plane failure in the
// result) makes it abort the session instead of committing.
// Lifetime/threading: plain values; the binding needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <vector>

#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/verify.h"

namespace weightcast::python {

struct StageResult {
  // Why a stage did not send: nothing (it sent, see result), bad input, a configuration the
  // updater cannot honour, or anything else (group setup, a closed updater, a bad token).
  enum class Local { kNone, kInput, kConfig, kOther };

  int stage = 0;
  std::string token;  // the session it belongs to
  bool sent = false;
  Local local = Local::kNone;
  std::string error;  // the local failure, when local != kNone
  sync::trainer::BucketSendResult result;
  std::vector<sync::trainer::SentDigest> digests;  // what was sent, when the updater verifies

  bool ok() const { return sent && result.ok && local == Local::kNone; }
  // The one-line description of its failure ("" when ok).
  std::string failure() const;
};

std::string to_json(const StageResult& r);
// Throws comm::BadRequestError on text to_json() did not produce.
StageResult parse_stage_result(std::string_view text);

void bind_stage_result(pybind11::module_& m);

}  // namespace weightcast::python

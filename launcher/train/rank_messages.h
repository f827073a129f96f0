// Typed messages between trainer ranks: what one rank (or the coordinator) tells the others, each
// as one bounded MPI broadcast (comm/mpi/mpi_helpers.h) of a JSON object that the receivers check
// field by field. A message that does not read back (a rank running another build, memory
// corruption) throws comm::PeerError naming the root, instead of being half-understood.
// Lifetime/threading: plain values and collective calls; every rank of `comm` must call the same
// broadcast with the same root, from its MPI thread.
#pragma once

#include <mpi.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "launcher/train/trainer_rank.h"
#include "sync/trainer/stage_outcome.h"

namespace weightcast::launcher::train {

// How a step of the protocol between ranks went: an exit code (trainer_rank.h, ExitCode; 0 = ok)
// and a text: an error message, or the step's payload (the decided selector, a session token, the
// step's line).
struct RankStatus {
  int code = 0;
  std::string text;
  bool ok() const { return code == 0; }
  bool operator==(const RankStatus&) const = default;
};

// After a failed attempt, whether the sources try the step again (an engine was dropped).
enum class AttemptNext { kDone, kRetry };

std::string to_json_text(const RankStatus& status);
RankStatus parse_rank_status(const std::string& text);  // comm::BadRequestError when malformed

// `value` of rank `root` on every rank of `comm`, bounded by `deadline`.
RankStatus broadcast_status(MPI_Comm comm, int root, const RankStatus& value,
                            comm::Deadline deadline);
AttemptNext broadcast_next(MPI_Comm comm, int root, AttemptNext value, comm::Deadline deadline);
sync::trainer::StageOutcome broadcast_outcome(MPI_Comm comm, int root,
                                              const sync::trainer::StageOutcome& value,
                                              comm::Deadline deadline);

// A status message between ranks.
inline RankStatus rank_status(int code, std::string text) {
  return RankStatus{code, std::move(text)};
}

// Runs `fn` (returning a RankStatus), turning exceptions into status messages with the exit code
// they stand for (trainer_rank.h).
template <typename F>
RankStatus guarded(F&& fn) {
  try {
    return fn();
  } catch (const comm::ConfigError& e) {
    return rank_status(kExitConfig, e.what());
  } catch (const comm::EnforceError& e) {
    return rank_status(kExitInternal, e.what());
  } catch (const std::invalid_argument& e) {
    return rank_status(kExitConfig, e.what());
  } catch (const std::exception& e) {
    return rank_status(kExitUpdateFailed, e.what());
  }
}

}  // namespace weightcast::launcher::train

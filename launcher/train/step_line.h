// The coordinator's view of a committed step: verification against the engines that received
// it, and the one line weightcast-train prints for it.
//
// With the elastic engine set (--on-engine-failure drop) the engines of a step can change from
// one step to the next; the verifier follows them (StepChecker::follow). A fresh mirror is exact
// for every engine that the step updated, since each step sends every tensor the selector
// covers: what an engine held before (initial weights after a restart, an older version after a
// drop) is overwritten by the step, and what it does not cover stays at its initial weights.
// Lifetime: one per coordinator; the engines must outlive it. Threading: the caller's thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "launcher/train/train_options.h"
#include "sync/trainer/report.h"
#include "sync/trainer/updater.h"
#include "sync/trainer/verify.h"

namespace weightcast::launcher::train {

// Where a step's time went outside the update report (seconds), printed with the report's phases
// on the step line: "phases gen=... gather=... gather_wait=... pause=... ... verify=... step=...".
struct StepTimes {
  comm::Clock::time_point start{};  // the step began: generation, before the update opens
  double gen = 0;                   // the weights of the step (the training compute's stand-in)
  double gather = 0;                // the stage source's TP/EP gather (overlaps the update)
  double gather_wait = 0;           // the sender's threads waiting on it, summed
  double verify = 0;                // --verify: sent digests, their exchange and the check
};

class StepChecker {
 public:
  StepChecker(const TrainOptions& options, const sync::ModelSpec& spec,
              sync::trainer::DistributedUpdater& updater, bool has_draft);

  // Rebuilds the verifier when the updater's members are not the ones it checks.
  void follow();

  // Verifies the committed step (when --verify) and formats its line. Returns the exit code the
  // step has (kExitOk, or kExitUpdateFailed on a mismatch without --keep-going) and the line.
  std::pair<int, std::string> committed(int step, const sync::trainer::UpdateReport& report,
                                        const std::vector<sync::trainer::SentDigest>& digests,
                                        const std::string& accept, StepTimes times);
  // With --drift realistic: the fraction of elements the coordinator's own shard changed this
  // step, printed as " changed <pct>%" (a sample of the model; negative: not printed).
  void set_changed(double fraction);

  // Whether some step failed verification under --keep-going.
  bool verify_failed() const { return verify_failed_; }

  // " engines current 2/3 dropped 1 readmitted 0 ..." with --on-engine-failure drop, else "".
  std::string membership(const sync::trainer::UpdateReport& report) const;

 private:
  const TrainOptions& o_;
  const sync::ModelSpec& spec_;
  sync::trainer::DistributedUpdater& updater_;
  bool has_draft_;
  std::string changed_;
  std::vector<sync::trainer::EngineApi*> engines_;  // the verifier's engines (it keeps a span)
  std::unique_ptr<sync::trainer::UpdateVerifier> verifier_;
  bool verify_failed_ = false;
};

}  // namespace weightcast::launcher::train

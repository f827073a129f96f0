// StageSteps: the steps of one update across pipeline stages for PyUpdater, as
// launcher/train/trainer_rank.cc runs them over MPI; here the user's own collective moves the
// token and the results between processes. The coordinator (stage 0's source) open_session()s and
// hands the token to the other stage sources, each source send_stage()s its own stage's tensors
// (stages one after another) and returns a StageResult, and the coordinator finish()es with every
// stage's result, committing or aborting. Holds the coordinator's open session and its report so
// far. Lifetime: owned by its PyUpdater, whose updater, worker and sent record it borrows.
// Threading: one caller at a time; methods need the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report_binding.h"
#include "signal_worker.h"
#include "stage_result.h"
#include "sync/trainer/updater.h"
#include "tensor_capture.h"
#include "verify_sent.h"

namespace weightcast::python {

// update()'s and open_session()'s `version`: None, an int or a str without whitespace.
std::optional<std::string> version_text(pybind11::handle version);

// What a run on the worker gives back: the report, or the exception it threw, and what the
// checks found.
struct UpdateOutcome {
  Report report;
  std::exception_ptr error;
  std::optional<std::string> changed;  // a tensor changed during the data phase
  std::vector<std::string> problems;   // verification
};

class StageSteps {
 public:
  // `live`: the updater, or throws when it is closed.
  StageSteps(std::function<sync::trainer::DistributedUpdater&()> live, SignalWorker& worker,
             SentRecord& sent, bool verify_each)
      : live_(std::move(live)), worker_(worker), sent_(sent), verify_each_(verify_each) {}

  // See PyUpdater.
  std::string open_session(pybind11::handle version);
  StageResult send_stage(const std::string& token, int stage, pybind11::handle named_tensors,
                         pybind11::handle await_tensor);
  pybind11::object finish(const std::string& token, pybind11::handle results);
  void abort(const std::string& why);

 private:
  StageResult stage_on_worker(const std::string& token, int stage, CapturedTensors& tensors,
                              pybind11::handle await_tensor);
  void finish_on_worker(const std::vector<StageResult>& results, UpdateOutcome& out);

  std::function<sync::trainer::DistributedUpdater&()> live_;
  SignalWorker& worker_;
  SentRecord& sent_;
  const bool verify_each_;
  // The coordinator's open session (open_session .. finish/abort) and its report so far.
  std::optional<sync::trainer::UpdateSession> session_;
  std::string session_token_;
  sync::trainer::UpdateReport session_report_;
};

}  // namespace weightcast::python

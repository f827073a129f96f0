// PyUpdater: weightcast.DistributedUpdater, the C++ DistributedUpdater driven from Python.
//
// update() captures the (name, tensor) pairs (tensor_capture.h: zero-copy views, references
// held), then runs the whole update on a worker thread with the GIL released, while the calling
// thread waits in short slices and checks for signals. On Ctrl-C (KeyboardInterrupt) it takes the
// updater's abort path: the data plane's communicator is aborted so a broadcast in progress
// returns at once, engines drop the session and continue on their previous weights, and the
// KeyboardInterrupt is raised once the worker has finished; the tensors are never released while
// the worker can still read them. A tensor read in place that was resized, re-pointed or
// modified during the data phase is detected before commit and the update aborted (InputError).
// Failures raise the exceptions of errors.h; a success returns the report.
// Pipeline-parallel trainers use the steps one by one (StageSteps, stage_steps.h): the coordinator
// (stage 0's source) open_session()s and hands the token to the other stage sources, each source
// send_stage()s its own stage's tensors (stages one after another) and returns a StageResult,
// and the coordinator finish()es with every stage's result, committing or aborting. The worker
// thread and its signal handling are SignalWorker's (signal_worker.h).
// Lifetime: owns the C++ updater; close() (or leaving a `with` block) asks the engines to leave
// its groups. Threading: one caller at a time, as the C++ updater; methods need the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "report_binding.h"
#include "signal_worker.h"
#include "stage_result.h"
#include "stage_steps.h"
#include "sync/model/lora.h"
#include "sync/trainer/updater.h"
#include "tensor_capture.h"
#include "verify_sent.h"

namespace weightcast::python {

class PyUpdater {
 public:
  PyUpdater(std::vector<std::string> engines, sync::trainer::UpdaterOptions options, bool verify);
  ~PyUpdater();
  PyUpdater(const PyUpdater&) = delete;
  PyUpdater& operator=(const PyUpdater&) = delete;

  pybind11::object update(pybind11::handle named_tensors, pybind11::handle version);
  // One adapter update (DistributedUpdater::update_lora; docs/lora.md): `config` is PEFT's
  // adapter config (a dict or its JSON), `op` "upsert" or "load". With verify=True, every
  // engine's /weights_checksum?lora= is compared with what was sent.
  pybind11::object update_lora(const std::string& name, pybind11::handle named_tensors,
                               pybind11::handle config, const std::string& op,
                               pybind11::handle version);
  // Checks every engine against the last committed update; raises VerifyError on a difference.
  void verify();
  void close();

  // --- the steps of one update across pipeline stages (StageSteps) ---
  // Coordinator: opens the session; returns its token. Raises as update() does.
  std::string open_session(pybind11::handle version);
  // Any stage source: sends `named_tensors` as stage `stage` of the session `token` names. Never
  // raises but for KeyboardInterrupt: every failure is in the result, for the coordinator.
  // `await_tensor` (None or a callable taking a name): called once per tensor, with the GIL,
  // before its bytes are first read (the sender's other threads wait for that call), and returns
  // once they are there, for tensors still being produced (received from other ranks) while the
  // stage sends; an exception it raises fails the stage.
  // A tensor it was called for may have been written in place until then (its version counter).
  StageResult send_stage(const std::string& token, int stage, pybind11::handle named_tensors,
                         pybind11::handle await_tensor);
  // Coordinator: every stage's result, stages 0 .. n-1 once each -> commit, or abort and raise.
  pybind11::object finish(const std::string& token, pybind11::handle results);
  // Coordinator: drops the open session on every engine (a no-op when none is open).
  void abort(const std::string& why);
  bool closed() const { return updater_ == nullptr; }
  std::string selector() const;
  const sync::trainer::UpdaterOptions& options() const;
  std::vector<std::string> engines() const { return urls_; }

 private:
  struct Job {
    const CapturedTensors* tensors = nullptr;
    std::optional<std::string> version;
    bool verify = false;
    std::optional<sync::LoraBegin> adapter;          // an adapter update's begin
    std::optional<sync::LoraConfig> adapter_config;  // and its config, parsed
  };
  pybind11::object run_job(Job& job, pybind11::handle named_tensors);
  using Outcome = UpdateOutcome;

  sync::trainer::DistributedUpdater& live();
  // On the worker thread, without the GIL.
  Outcome run(const Job& job);
  void run_update(const Job& job, Outcome& out);
  // One attempt: open, send, commit (and verify), or the abort path.
  void run_attempt(const Job& job, Outcome& out);
  bool prepare(sync::trainer::UpdateReport& report);

  std::vector<std::string> urls_;
  std::unique_ptr<sync::trainer::DistributedUpdater> updater_;
  bool verify_each_ = false;
  SentRecord sent_;
  SignalWorker worker_;  // runs the C++ work off the interpreter's thread, handling Ctrl-C
  StageSteps steps_;     // the coordinator's open session and the stage steps
};

}  // namespace weightcast::python

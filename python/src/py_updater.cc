#include "py_updater.h"

#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include "comm/errors.h"
#include "comm/stop_signals.h"
#include "errors.h"
#include "sync/protocol/tensor.h"
#include "sync/trainer/engine_calls.h"

namespace py = pybind11;
namespace wt = weightcast::sync::trainer;

namespace weightcast::python {

namespace {

constexpr auto kSignalPoll = std::chrono::milliseconds(50);

}  // namespace

std::optional<std::string> version_text(py::handle version) {
  if (version.is_none()) return std::nullopt;
  if (py::isinstance<py::bool_>(version) ||
      !(py::isinstance<py::int_>(version) || py::isinstance<py::str>(version))) {
    throw InputFailure("version must be None, an int or a str");
  }
  std::string text = py::str(version);
  try {
    sync::validate_tensor_name(text, "version", 256);  // printable, no whitespace, as a token
  } catch (const comm::BadRequestError& e) {
    throw InputFailure(e.what());
  }
  return text;
}

PyUpdater::PyUpdater(std::vector<std::string> engines, wt::UpdaterOptions options, bool verify)
    : urls_(engines), verify_each_(verify) {
  auto factory = options.communicator_factory;
  options.communicator_factory = [this, factory](std::string_view backend,
                                                 const comm::CommOptions& opts) {
    auto comm = factory ? factory(backend, opts) : comm::create_communicator(backend, opts);
    comm_.store(comm.get());
    return comm;
  };
  updater_ = std::make_unique<wt::DistributedUpdater>(std::move(engines), std::move(options));
}

PyUpdater::~PyUpdater() {
  if (updater_ && Py_IsInitialized()) {
    py::gil_scoped_release release;
    updater_.reset();
  }
}

wt::DistributedUpdater& PyUpdater::live() {
  if (!updater_) throw comm::ConfigError("this DistributedUpdater is closed");
  return *updater_;
}

std::string PyUpdater::selector() const {
  if (!updater_) throw comm::ConfigError("this DistributedUpdater is closed");
  return std::string(sync::to_string(updater_->selector()));
}

const wt::UpdaterOptions& PyUpdater::options() const {
  if (!updater_) throw comm::ConfigError("this DistributedUpdater is closed");
  return updater_->options();
}

void PyUpdater::close() {
  if (!updater_) return;
  py::gil_scoped_release release;
  updater_.reset();
  comm_.store(nullptr);
}

void PyUpdater::interrupt() {
  interrupted_ = true;
  // The communicator is alive while the data phase runs (groups are replaced only between
  // updates, on the worker), and abort() may be called from any thread.
  if (phase_ == Phase::kData) {
    if (comm::Communicator* comm = comm_.load()) comm->abort();
  }
}

void PyUpdater::run_on_worker(const std::function<void()>& fn) {
  std::promise<void> done;
  auto finished = done.get_future();
  interrupted_ = false;
  std::exception_ptr pending;
  {
    py::gil_scoped_release release;
    std::thread worker([&fn, &done] {
      // Signals stay with the interpreter's thread, so the worker and every thread it starts (the
      // data plane's, the HTTP calls') never see an EINTR from a Ctrl-C meant for Python.
      comm::block_stop_signals();
      fn();
      done.set_value();
    });
    while (finished.wait_for(kSignalPoll) != std::future_status::ready) {
      py::gil_scoped_acquire gil;
      if (!pending && PyErr_CheckSignals() != 0) {
        try {
          throw py::error_already_set();
        } catch (...) {
          pending = std::current_exception();
        }
        interrupt();
      }
    }
    worker.join();
  }
  if (pending) std::rethrow_exception(pending);
}

bool PyUpdater::prepare(wt::UpdateReport& report) {
  report.selector = updater_->selector();
  try {
    updater_->ensure_group(0);
    return true;
  } catch (const wt::EngineCallError& e) {
    report.failures = e.failures();
    report.fail("preparing the update failed");
  } catch (const comm::ConfigError&) {
    throw;
  } catch (const comm::EnforceError&) {
    throw;
  } catch (const comm::Error& e) {
    report.fail(std::string("preparing the update failed: ") + e.what());
  }
  return false;
}

void PyUpdater::run_update(const Job& job, Outcome& out) {
  wt::DistributedUpdater& u = *updater_;
  // The elastic engine set (on_engine_failure="drop"): dropped engines due a probe are probed
  // first; a failed attempt drops the engines that do not answer and the update is redone on the
  // others, at most once per engine. Under "fail" there is one attempt.
  try {
    u.prepare_update();
  } catch (const comm::ConfigError&) {
    throw;
  } catch (const comm::Error&) {
    // A probe that could not be made leaves the engine out; the update goes on without it.
  }
  std::vector<wt::UpdateReport::Dropped> dropped;
  for (std::size_t attempt = 0;; ++attempt) {
    out = Outcome{};
    run_attempt(job, out);
    wt::UpdateReport& report = out.report.base;
    report.dropped.insert(report.dropped.begin(), dropped.begin(), dropped.end());
    if (report.ok || interrupted_ || out.changed || attempt + 1 >= u.engines().size() ||
        !u.drop_failed(report)) {
      u.note_membership(report);
      return;
    }
    dropped = std::move(report.dropped);
  }
}

void PyUpdater::run_attempt(const Job& job, Outcome& out) {
  wt::DistributedUpdater& u = *updater_;
  wt::UpdateReport& report = out.report.base;
  const auto start = std::chrono::steady_clock::now();
  if (!prepare(report)) return;
  const std::chrono::duration<double> prepared = std::chrono::steady_clock::now() - start;
  if (interrupted_) {
    report.fail("interrupted before the session opened");
    return;
  }
  // The version the engines commit; unset: one more than the highest they hold.
  auto session = u.open_session(report, job.version);
  report.phases.prepare = prepared.count();
  if (!session) return;
  if (interrupted_) return u.abort(report, "interrupted");
  phase_ = Phase::kData;
  const wt::BucketSendResult sent = u.send_stage(*session, 0, job.tensors->views());
  phase_ = Phase::kIdle;
  u.record(sent, report);
  if (!report.error.empty()) return;
  {
    py::gil_scoped_acquire gil;
    out.changed = job.tensors->changed();
  }
  if (out.changed)
    return u.abort(report, "tensor '" + *out.changed + "' changed during the update");
  if (interrupted_) return u.abort(report, "interrupted");
  u.finish(*session, report);
  if (!report.ok || !job.verify) return;
  sent_.record(u.selector(), report.version, job.tensors->views());
  out.problems = sent_.check(u.engines(), u.connect());
  out.report.verified = out.problems.empty();
}

PyUpdater::Outcome PyUpdater::run(const Job& job) {
  Outcome out;
  try {
    run_update(job, out);
  } catch (...) {
    out.error = std::current_exception();
  }
  phase_ = Phase::kIdle;
  return out;
}

py::object PyUpdater::update(py::handle named_tensors, py::handle version) {
  live();
  Job job;
  job.version = version_text(version);
  job.verify = verify_each_;
  CapturedTensors tensors = CapturedTensors::capture(named_tensors);
  job.tensors = &tensors;
  Outcome out;
  run_on_worker([&] { out = run(job); });
  if (out.error) std::rethrow_exception(out.error);
  if (out.changed) {
    throw InputFailure("tensor '" + *out.changed +
                       "' was resized, re-pointed or modified during update(); the update was "
                       "aborted and the engines keep their previous weights");
  }
  if (!out.report.base.ok) throw UpdateFailure(std::move(out.report.base));
  if (!out.problems.empty()) throw VerifyFailure(std::move(out.problems));
  return to_python(std::move(out.report));
}

void PyUpdater::verify() {
  wt::DistributedUpdater& u = live();
  if (sent_.empty()) {
    throw comm::ConfigError(
        "verify(): no verified update to check against; create the updater with verify=True "
        "so that update() records the digests of what it sends");
  }
  std::vector<std::string> problems;
  {
    py::gil_scoped_release release;
    problems = sent_.check(u.engines(), u.connect());
  }
  if (!problems.empty()) throw VerifyFailure(std::move(problems));
}

}  // namespace weightcast::python

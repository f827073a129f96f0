#include "py_updater.h"

#include <chrono>
#include <utility>

#include "comm/errors.h"
#include "errors.h"
#include "sync/model/lora.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/verify.h"

namespace py = pybind11;
namespace wt = weightcast::sync::trainer;

namespace weightcast::python {

PyUpdater::PyUpdater(std::vector<std::string> engines, wt::UpdaterOptions options, bool verify)
    : urls_(engines),
      verify_each_(verify),
      steps_([this]() -> wt::DistributedUpdater& { return live(); }, worker_, sent_, verify) {
  auto factory = options.communicator_factory;
  options.communicator_factory = [this, factory](std::string_view backend,
                                                 const comm::CommOptions& opts) {
    auto comm = factory ? factory(backend, opts) : comm::create_communicator(backend, opts);
    worker_.set_communicator(comm.get());
    return comm;
  };
  // Ctrl-C stops a data phase before its next bucket, whichever path it takes (the chain's
  // communicator is aborted as well, mid-broadcast; the colocated path has none to abort).
  options.buckets.stop_requested = [this] { return worker_.interrupted(); };
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
  worker_.set_communicator(nullptr);
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
    if (report.ok || worker_.interrupted() || out.changed || attempt + 1 >= u.engines().size() ||
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
  if (worker_.interrupted()) {
    report.fail("interrupted before the session opened");
    return;
  }
  // The version the engines commit; unset: one more than the highest they hold.
  auto session = u.open_session(report, job.version, job.adapter);
  report.phases.prepare = prepared.count();
  if (!session) return;
  if (worker_.interrupted()) return u.abort(report, "interrupted");
  worker_.set_phase(SignalWorker::Phase::kData);
  const wt::BucketSendResult sent = u.send_stage(*session, 0, job.tensors->views());
  worker_.set_phase(SignalWorker::Phase::kIdle);
  u.record(sent, report);
  if (!report.error.empty()) return;
  {
    py::gil_scoped_acquire gil;
    out.changed = job.tensors->changed();
  }
  if (out.changed)
    return u.abort(report, "tensor '" + *out.changed + "' changed during the update");
  if (worker_.interrupted()) return u.abort(report, "interrupted");
  u.finish(*session, report);
  if (!report.ok || !job.verify) return;
  if (job.adapter) {
    out.problems = wt::adapter_problems(u.members(), job.adapter->name, report.version,
                                        wt::sent_digests(job.tensors->views()));
    out.report.verified = out.problems.empty();
    return;
  }
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
  worker_.set_phase(SignalWorker::Phase::kIdle);
  return out;
}

py::object PyUpdater::update(py::handle named_tensors, py::handle version) {
  live();
  Job job;
  job.version = version_text(version);
  return run_job(job, named_tensors);
}

py::object PyUpdater::update_lora(const std::string& name, py::handle named_tensors,
                                  py::handle config, const std::string& op, py::handle version) {
  live();
  if (op != "upsert" && op != "load") {
    throw comm::ConfigError("update_lora: op '" + op + "' is not \"upsert\" or \"load\"");
  }
  std::string config_json =
      py::isinstance<py::str>(config)
          ? config.cast<std::string>()
          : py::module_::import("json").attr("dumps")(config).cast<std::string>();
  sync::LoraConfig parsed;
  try {
    sync::validate_adapter_name(name, "update_lora: name");
    parsed = sync::parse_lora_config(config_json);
  } catch (const comm::BadRequestError& e) {
    throw comm::ConfigError(std::string("update_lora: ") + e.what());
  }
  Job job;
  job.version = version_text(version);
  job.adapter = sync::LoraBegin{name, sync::to_json_string(parsed), op == "upsert"};
  job.adapter_config = std::move(parsed);
  return run_job(job, named_tensors);
}

py::object PyUpdater::run_job(Job& job, py::handle named_tensors) {
  job.verify = verify_each_;
  CapturedTensors tensors = CapturedTensors::capture(named_tensors);
  if (job.adapter_config) {
    try {
      // Misuse, refused before any engine is asked: each an A or B of a targeted module.
      for (const auto& t : tensors.views()) sync::adapted_module(*job.adapter_config, t.meta.name);
    } catch (const comm::BadRequestError& e) {
      throw InputFailure(std::string("update_lora: ") + e.what());
    }
  }
  job.tensors = &tensors;
  Outcome out;
  worker_.run([&] { out = run(job); });
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

std::string PyUpdater::open_session(py::handle version) {
  return steps_.open_session(version);
}

StageResult PyUpdater::send_stage(const std::string& token, int stage, py::handle named_tensors,
                                  py::handle await_tensor) {
  return steps_.send_stage(token, stage, named_tensors, await_tensor);
}

py::object PyUpdater::finish(const std::string& token, py::handle results) {
  return steps_.finish(token, results);
}

void PyUpdater::abort(const std::string& why) {
  steps_.abort(why);
}

}  // namespace weightcast::python

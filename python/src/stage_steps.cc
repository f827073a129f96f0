#include "stage_steps.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "comm/errors.h"
#include "errors.h"
#include "sync/protocol/tensor.h"
#include "sync/trainer/engine_calls.h"

namespace py = pybind11;
namespace wt = weightcast::sync::trainer;

namespace weightcast::python {

namespace {

// send_stage()'s await_tensor, called once per tensor name however many of the sender's threads
// (hasher, packer, data plane) read that tensor: the first reader calls it, with the GIL, and
// the others wait for that call's outcome without it, bounded by the phase deadline.
class AwaitOnce {
 public:
  AwaitOnce(CapturedTensors& tensors, py::handle fn) : tensors_(tensors), fn_(fn) {}

  void operator()(const std::string& name, comm::Deadline deadline) {
    std::unique_lock lock(mu_);
    const bool first = !state_.contains(name);
    Entry& entry = state_[name];  // references stay valid when the map grows
    if (first) {
      lock.unlock();
      std::string error;
      {
        py::gil_scoped_acquire gil;
        try {
          fn_(name);
          tensors_.written(name);  // it may have been written in place until now
        } catch (py::error_already_set& e) {
          error = "await_tensor('" + name + "') raised " + e.what();
        }
      }
      lock.lock();
      entry.done = true;
      entry.error = std::move(error);
      cv_.notify_all();
    } else if (!cv_.wait_until(lock, deadline, [&] { return entry.done; })) {
      throw comm::TimeoutError("tensor '" + name + "' did not arrive in time");
    }
    if (!entry.error.empty()) throw comm::Error(entry.error);
  }

 private:
  struct Entry {
    bool done = false;
    std::string error;
  };
  CapturedTensors& tensors_;
  py::handle fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, Entry> state_;
};

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

std::string StageSteps::open_session(py::handle version) {
  live_();
  if (session_) {
    throw comm::ConfigError("open_session(): a session is open (token '" + session_token_ +
                            "'); finish() or abort() it first");
  }
  const auto text = version_text(version);
  UpdateOutcome out;
  std::optional<wt::UpdateSession> opened;
  worker_.run([&] {
    try {
      opened = live_().open_session(out.report.base, text);
    } catch (...) {
      out.error = std::current_exception();
    }
  });
  if (out.error) std::rethrow_exception(out.error);
  if (!opened) throw UpdateFailure(std::move(out.report.base));
  session_report_ = std::move(out.report.base);
  session_token_ = opened->token();
  session_ = std::move(opened);
  return session_token_;
}

StageResult StageSteps::stage_on_worker(const std::string& token, int stage,
                                        CapturedTensors& tensors, py::handle await_tensor) {
  StageResult r;
  r.stage = stage;
  r.token = token;
  try {
    const wt::UpdateSession session = wt::join_session(token);
    if (session.selector() != live_().selector()) {
      throw comm::ConfigError(
          "the session's selector is '" + std::string(sync::to_string(session.selector())) +
          "', this updater's '" + std::string(sync::to_string(live_().selector())) +
          "': every stage source must be created with the same selector");
    }
    live_().adopt(session);  // the coordinator's engine set for this session
    live_().ensure_group(stage);
    worker_.set_phase(SignalWorker::Phase::kData);
    std::function<void(const std::string&, comm::Deadline)> await;
    std::optional<AwaitOnce> once;
    if (!await_tensor.is_none()) {
      once.emplace(tensors, await_tensor);
      await = [&once](const std::string& name, comm::Deadline deadline) {
        (*once)(name, deadline);
      };
    }
    r.result = live_().send_stage(session, stage, tensors.views(), std::move(await));
    worker_.set_phase(SignalWorker::Phase::kIdle);
    r.sent = true;
  } catch (const wt::EngineCallError& e) {
    r.local = StageResult::Local::kOther;
    r.error = e.what();
    r.result.failures = e.failures();
  } catch (const comm::ConfigError& e) {
    r.local = StageResult::Local::kConfig;
    r.error = e.what();
  } catch (const std::exception& e) {
    r.local = StageResult::Local::kOther;
    r.error = e.what();
  }
  worker_.set_phase(SignalWorker::Phase::kIdle);
  r.result.ok = r.result.ok && r.local == StageResult::Local::kNone;
  return r;
}

StageResult StageSteps::send_stage(const std::string& token, int stage, py::handle named_tensors,
                                   py::handle await_tensor) {
  StageResult r;
  r.stage = stage;
  r.token = token;
  r.result.ok = false;
  CapturedTensors tensors;
  try {
    live_();
    if (stage < 0) throw comm::ConfigError("stage must be >= 0");
    if (!await_tensor.is_none() && !PyCallable_Check(await_tensor.ptr())) {
      throw comm::ConfigError("await_tensor must be None or a callable taking a tensor name");
    }
    tensors = CapturedTensors::capture(named_tensors);
  } catch (const InputFailure& e) {
    r.local = StageResult::Local::kInput;
    r.error = e.what();
    return r;
  } catch (const comm::ConfigError& e) {
    r.local = StageResult::Local::kConfig;
    r.error = e.what();
    return r;
  }
  worker_.run([&] { r = stage_on_worker(token, stage, tensors, await_tensor); });
  if (r.ok()) {
    if (const auto changed = tensors.changed()) {
      r.local = StageResult::Local::kInput;
      r.error = "tensor '" + *changed + "' was resized, re-pointed or modified during send_stage()";
      r.result.ok = false;
    } else if (verify_each_) {
      py::gil_scoped_release release;
      r.digests = wt::sent_digests(tensors.views());
    }
  }
  return r;
}

void StageSteps::finish_on_worker(const std::vector<StageResult>& results, UpdateOutcome& out) {
  wt::UpdateReport& report = out.report.base;
  for (const StageResult& r : results) {
    if (r.local != StageResult::Local::kNone || !r.sent) {
      report.failures.insert(report.failures.end(), r.result.failures.begin(),
                             r.result.failures.end());
      live_().abort(report, r.failure());
      return;
    }
    live_().record(r.result, report);
    if (!report.error.empty()) return;
  }
  if (worker_.interrupted()) return live_().abort(report, "interrupted");
  live_().finish(*session_, report);
  if (!report.ok || !verify_each_) return;
  std::vector<wt::SentDigest> digests;
  for (const StageResult& r : results)
    digests.insert(digests.end(), r.digests.begin(), r.digests.end());
  sent_.record(live_().selector(), report.version, std::move(digests));
  out.problems = sent_.check(live_().engines(), live_().connect());
  out.report.verified = out.problems.empty();
}

namespace {

// The results as finish() needs them: StageResults of session `token`, stages 0 .. n-1 once each,
// in stage order. Otherwise the reason, in `why`.
std::vector<StageResult> stage_results(py::handle results, const std::string& token,
                                       std::string& why) {
  std::vector<StageResult> out;
  for (py::handle item : py::iter(results)) {
    if (!py::isinstance<StageResult>(item)) {
      why = "finish() takes the StageResult of every stage, got a " +
            std::string(py::str(py::type::handle_of(item).attr("__name__")));
      return {};
    }
    out.push_back(item.cast<StageResult>());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.stage < b.stage; });
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i].token != token) {
      why = "stage " + std::to_string(out[i].stage) + "'s result belongs to another session";
    } else if (out[i].stage != static_cast<int>(i)) {
      why = "finish() needs one result per stage 0 .. n-1; stage " + std::to_string(i) +
            (out[i].stage < static_cast<int>(i) ? " comes twice" : " is missing");
    }
    if (!why.empty()) return {};
  }
  if (out.empty()) why = "finish() needs one result per stage; got none";
  return out;
}

}  // namespace

py::object StageSteps::finish(const std::string& token, py::handle results) {
  live_();
  if (!session_ || token != session_token_) {
    throw comm::ConfigError("finish(): no open session has token '" + token + "'" +
                            (session_ ? "; the open one is '" + session_token_ + "'" : ""));
  }
  std::string why;
  const std::vector<StageResult> stages = stage_results(results, token, why);
  UpdateOutcome out;
  out.report.base = std::move(session_report_);
  bool input_failed = false;
  for (const auto& r : stages) input_failed = input_failed || r.local == StageResult::Local::kInput;
  worker_.run([&] {
    try {
      if (!why.empty()) return live_().abort(out.report.base, why);
      finish_on_worker(stages, out);
    } catch (...) {
      out.error = std::current_exception();
    }
  });
  session_.reset();
  session_token_.clear();
  if (out.error) std::rethrow_exception(out.error);
  if (!why.empty()) throw comm::ConfigError(why + "; the session was aborted");
  if (!out.report.base.ok && input_failed) {
    throw InputFailure(out.report.base.error + "; the engines keep their previous weights");
  }
  if (!out.report.base.ok) throw UpdateFailure(std::move(out.report.base));
  if (!out.problems.empty()) throw VerifyFailure(std::move(out.problems));
  return to_python(std::move(out.report));
}

void StageSteps::abort(const std::string& why) {
  live_();
  if (!session_) return;
  wt::UpdateReport report = std::move(session_report_);
  worker_.run([&] {
    try {
      live_().abort(report, why);
    } catch (...) {  // best effort: the engines' session timeout is the backstop
    }
  });
  session_.reset();
  session_token_.clear();
}

}  // namespace weightcast::python

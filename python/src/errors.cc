#include "errors.h"

#include <utility>

#include "comm/errors.h"
#include "report_binding.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/engine_calls.h"

namespace py = pybind11;

namespace weightcast::python {

namespace {

struct Classes {
  PyObject* error = nullptr;
  PyObject* config = nullptr;
  PyObject* input = nullptr;
  PyObject* timeout = nullptr;
  PyObject* peer = nullptr;
  PyObject* update = nullptr;
  PyObject* engine = nullptr;
  PyObject* engine_timeout = nullptr;
  PyObject* verify = nullptr;
};
Classes classes;

PyObject* make_class(py::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                     const char* doc) {
  py::tuple base_tuple(bases.size());
  std::size_t i = 0;
  for (PyObject* b : bases) base_tuple[i++] = py::reinterpret_borrow<py::object>(b);
  const std::string qualified = std::string("weightcast.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;  // the module keeps a reference; this one is never released
}

// Raises an instance of `cls` with `message` and the given attributes.
void raise(PyObject* cls, const std::string& message,
           std::initializer_list<std::pair<const char*, py::object>> attrs = {}) {
  py::object exc = py::reinterpret_borrow<py::object>(cls)(message);
  for (const auto& [name, value] : attrs) exc.attr(name) = value;
  PyErr_SetObject(cls, exc.ptr());
}

void raise_update(const UpdateFailure& e) {
  const auto& r = e.report();
  const sync::trainer::EngineFailure* blamed = sync::trainer::blame(r.failures);
  py::object report = to_python(Report{r, std::nullopt});
  if (r.failed_engine.empty()) {
    raise(classes.update, e.what(), {{"report", report}});
    return;
  }
  const bool timed_out = blamed != nullptr && blamed->timed_out;
  raise(timed_out ? classes.engine_timeout : classes.engine, e.what(),
        {{"report", report},
         {"engine", py::str(r.failed_engine)},
         {"peer", py::str(r.failed_engine)},
         {"route", py::str(r.failed_route)}});
}

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const InputFailure& e) {
    raise(classes.input, e.what());
  } catch (const UpdateFailure& e) {
    raise_update(e);
  } catch (const VerifyFailure& e) {
    raise(classes.verify, e.what(), {{"problems", py::cast(e.problems())}});
  } catch (const sync::trainer::EngineCallError& e) {
    sync::trainer::UpdateReport report;
    report.failures = e.failures();
    report.fail(e.what());
    raise_update(UpdateFailure(std::move(report)));
  } catch (const sync::trainer::EngineError& e) {
    raise(classes.engine, e.what(),
          {{"report", py::none()},
           {"engine", py::str(e.engine())},
           {"peer", py::str(e.engine())},
           {"route", py::str(e.route())}});
  } catch (const comm::ConfigError& e) {
    raise(classes.config, e.what());
  } catch (const comm::TimeoutError& e) {
    raise(classes.timeout, e.what());
  } catch (const comm::PeerError& e) {
    raise(classes.peer, e.what(), {{"peer", py::str(e.peer())}});
  } catch (const comm::BadRequestError& e) {
    raise(classes.input, e.what());
  } catch (const comm::Error& e) {
    raise(classes.error, e.what());
  }
}

}  // namespace

namespace {
std::string failure_text(const sync::trainer::UpdateReport& r) {
  return (r.version.empty() ? std::string("update failed: ")
                            : "update to version " + r.version + " failed: ") +
         r.error;
}
}  // namespace

UpdateFailure::UpdateFailure(sync::trainer::UpdateReport report)
    : std::runtime_error(failure_text(report)), report_(std::move(report)) {}

namespace {
std::string join_problems(const std::vector<std::string>& problems) {
  std::string text = std::to_string(problems.size()) + " problem(s)";
  for (std::size_t i = 0; i < problems.size() && i < 5; ++i) text += "\n  " + problems[i];
  if (problems.size() > 5) text += "\n  ...";
  return text;
}
}  // namespace

VerifyFailure::VerifyFailure(std::vector<std::string> problems)
    : std::runtime_error(join_problems(problems)), problems_(std::move(problems)) {}

void register_errors(py::module_& m) {
  classes.error = make_class(m, "Error", {PyExc_Exception}, "Any weightcast failure.");
  classes.config = make_class(m, "ConfigError", {classes.error},
                              "Options that the engines or this build cannot honour.");
  classes.input = make_class(m, "InputError", {classes.error, PyExc_ValueError, PyExc_TypeError},
                             "A bad (name, tensor) pair; nothing was sent.");
  classes.timeout =
      make_class(m, "TimeoutError", {classes.error, PyExc_TimeoutError}, "A deadline passed.");
  classes.peer = make_class(m, "PeerError", {classes.error, PyExc_ConnectionError},
                            "A peer failed; .peer names it.");
  classes.update = make_class(m, "UpdateError", {classes.error},
                              "update() failed and was aborted; engines keep their previous "
                              "weights. .report is the UpdateReport.");
  classes.engine = make_class(m, "EngineError", {classes.update, classes.peer},
                              "An update failed because of an engine: .engine (URL), .route.");
  classes.engine_timeout = make_class(m, "EngineTimeoutError", {classes.engine, classes.timeout},
                                      "An update failed because an engine did not answer in time.");
  classes.verify = make_class(m, "VerifyError", {classes.error},
                              "Engines hold other bytes than were sent; .problems lists them.");
  py::register_exception_translator(&translate);
}

}  // namespace weightcast::python

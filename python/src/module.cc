// The _weightcast extension module: weight_update_selector, DistributedUpdater, UpdateReport and
// the exception classes. The weightcast package (weightcast/__init__.py) re-exports them.
// Nothing here imports torch or numpy: tensors are read through their own attributes or the
// buffer protocol (tensor_capture.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "comm/errors.h"
#include "errors.h"
#include "py_colocate.h"
#include "py_receiver.h"
#include "py_session.h"
#include "py_shard_plan.h"
#include "py_store.h"
#include "py_updater.h"
#include "report_binding.h"
#include "stage_result.h"
#include "sync/protocol/decision.h"
#include "sync/protocol/protocol.h"

namespace py = pybind11;
namespace wt = weightcast::sync::trainer;

namespace weightcast::python {
namespace {

comm::Millis millis(double seconds, const char* name) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw comm::ConfigError(std::string(name) + " must be a positive number of seconds");
  }
  return comm::Millis(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

std::string selector_of(std::optional<std::string> speculative_algorithm,
                        std::optional<int> mtp_num_layers,
                        std::optional<std::string> megatron_to_hf_mode) {
  sync::SelectorConfig config{std::move(speculative_algorithm), mtp_num_layers,
                              std::move(megatron_to_hf_mode)};
  return std::string(sync::to_string(sync::weight_update_selector(config)));
}

struct Settings {
  std::optional<std::string> selector;
  std::string backend = "gloo";
  std::size_t bucket_bytes = wt::kDefaultBucketBytes;
  std::size_t max_in_flight = 2;
  std::optional<std::string> token, store_token;
  std::string bind_address = "127.0.0.1", group_prefix = "weightcast", pause_mode = "abort";
  double connect_timeout = 5, request_timeout = 60, group_timeout = 120, update_timeout = 300;
  double bucket_delay = 0;
  std::string delta = "auto";
  std::string on_engine_failure = "fail";
  double probe_timeout = 2;
  std::string colocate = "auto";
  std::string shard = "auto";
  bool keep_alive = true;
  std::string colocate_memory = "host";
};

wt::UpdaterOptions updater_options(const Settings& s) {
  wt::UpdaterOptions o;
  try {
    if (s.selector) o.selector = sync::parse_selector(*s.selector);
    o.backend = sync::parse_backend(s.backend);
    o.pause_mode = sync::parse_pause_mode(s.pause_mode);
  } catch (const comm::BadRequestError& e) {
    throw comm::ConfigError(e.what());
  }
  if (s.bucket_bytes == 0) throw comm::ConfigError("bucket_bytes must be > 0");
  if (s.max_in_flight == 0) throw comm::ConfigError("max_in_flight must be >= 1");
  o.buckets.bucket_bytes = s.bucket_bytes;
  o.buckets.max_in_flight = s.max_in_flight;
  o.buckets.timeout = millis(s.update_timeout, "update_timeout");
  o.token = s.token.value_or("");
  o.store_token = s.store_token.value_or("");
  o.bind_address = s.bind_address;
  o.group_prefix = s.group_prefix;
  o.connect_timeout = millis(s.connect_timeout, "connect_timeout");
  o.request_timeout = millis(s.request_timeout, "request_timeout");
  o.group_timeout = millis(s.group_timeout, "group_timeout");
  if (s.bucket_delay < 0) throw comm::ConfigError("bucket_delay must be >= 0");
  o.buckets.bucket_delay = comm::Millis(static_cast<std::int64_t>(s.bucket_delay * 1000.0));
  o.delta = wt::parse_delta_mode(s.delta);
  o.on_engine_failure = wt::parse_engine_failure_policy(s.on_engine_failure);
  o.probe_timeout = millis(s.probe_timeout, "probe_timeout");
  o.colocate = wt::parse_colocate_mode(s.colocate);
  o.colocate_memory = wt::parse_colocate_memory(s.colocate_memory);
  o.shard = wt::parse_shard_mode(s.shard);
  o.keep_alive = s.keep_alive;
  return o;
}

std::unique_ptr<PyUpdater> make_updater(std::vector<std::string> engines, const Settings& s,
                                        bool verify) {
  if (engines.empty()) throw comm::ConfigError("DistributedUpdater: engines is empty");
  return std::make_unique<PyUpdater>(std::move(engines), updater_options(s), verify);
}

// DistributedUpdater(...)'s keyword arguments, in the order bind_constructor declares them.
std::unique_ptr<PyUpdater> construct_updater(
    std::vector<std::string> engines, std::string backend, std::optional<std::string> selector,
    std::size_t bucket_bytes, std::size_t max_in_flight, std::optional<std::string> token,
    std::optional<std::string> store_token, std::string bind_address, std::string group_prefix,
    std::string pause_mode, double connect_timeout, double request_timeout, double group_timeout,
    double update_timeout, bool verify, double bucket_delay, std::string delta,
    std::string on_engine_failure, double probe_timeout, std::variant<bool, std::string> colocate,
    std::string shard, bool keep_alive, std::string colocate_memory) {
  // colocate=True / False read as "on" / "off" (the and a user's first guess).
  std::string colocate_mode = std::holds_alternative<bool>(colocate)
                                  ? std::string(std::get<bool>(colocate) ? "on" : "off")
                                  : std::get<std::string>(std::move(colocate));
  Settings s{std::move(selector),
             std::move(backend),
             bucket_bytes,
             max_in_flight,
             std::move(token),
             std::move(store_token),
             std::move(bind_address),
             std::move(group_prefix),
             std::move(pause_mode),
             connect_timeout,
             request_timeout,
             group_timeout,
             update_timeout,
             bucket_delay,
             std::move(delta),
             std::move(on_engine_failure),
             probe_timeout,
             std::move(colocate_mode),
             std::move(shard),
             keep_alive,
             std::move(colocate_memory)};
  return make_updater(std::move(engines), s, verify);
}

void bind_constructor(py::class_<PyUpdater>& c) {
  c.def(py::init(&construct_updater), py::kw_only(), py::arg("engines"),
        py::arg("backend") = "gloo", py::arg("selector") = py::none(),
        py::arg("bucket_bytes") = wt::kDefaultBucketBytes, py::arg("max_in_flight") = 2,
        py::arg("token") = py::none(), py::arg("store_token") = py::none(),
        py::arg("bind_address") = "127.0.0.1", py::arg("group_prefix") = "weightcast",
        py::arg("pause_mode") = "abort", py::arg("connect_timeout") = 5.0,
        py::arg("request_timeout") = 60.0, py::arg("group_timeout") = 120.0,
        py::arg("update_timeout") = 300.0, py::arg("verify") = false, py::arg("bucket_delay") = 0.0,
        py::arg("delta") = "auto", py::arg("on_engine_failure") = "fail",
        py::arg("probe_timeout") = 2.0, py::arg("colocate") = "auto", py::arg("shard") = "auto",
        py::arg("keep_alive") = true, py::arg("colocate_memory") = "host");
}

// update(), the pipeline-parallel steps (open_session, send_stage, finish, abort), verify, close.
void bind_methods(py::class_<PyUpdater>& c) {
  c.def("update", &PyUpdater::update, py::arg("named_tensors"), py::arg("version") = py::none(),
        "Sends every (name, tensor) pair in one update; returns its UpdateReport.")
      .def("update_lora", &PyUpdater::update_lora, py::arg("name"), py::arg("named_tensors"),
           py::arg("config"), py::arg("op") = "upsert", py::arg("version") = py::none(),
           "Sends one LoRA adapter (PEFT-named lora_A/lora_B tensors, PEFT's config with r, "
           "lora_alpha, target_modules) and swaps it in under `name` on every engine, in a "
           "session of selector target; the base weights and any draft stay as they are. "
           "op: upsert (replace a held adapter) or load (refused where one is held). "
           "Returns its UpdateReport (version: the adapter's).")
      .def("open_session", &PyUpdater::open_session, py::arg("version") = py::none(),
           "Coordinator of a pipeline-parallel update (stage 0's source): pauses the engines and "
           "opens the session; returns its token for the other stage sources.")
      .def(
          "send_stage", &PyUpdater::send_stage, py::arg("token"), py::arg("stage"),
          py::arg("named_tensors"), py::arg("await_tensor") = py::none(),
          "Any stage source: sends this stage's tensors in the session `token` names; returns a "
          "picklable StageResult for the coordinator (failures are in it, not raised). "
          "await_tensor(name), if given, is called once per tensor before its bytes are first read "
          "and returns once they are there (tensors still arriving while the stage sends).")
      .def("finish", &PyUpdater::finish, py::arg("token"), py::arg("results"),
           "Coordinator: with every stage's StageResult, commits the session, or aborts it and "
           "raises as update() does; returns the UpdateReport.")
      .def("abort", &PyUpdater::abort, py::arg("why") = "aborted by the trainer",
           "Coordinator: drops the open session; the engines keep their previous weights.")
      .def("verify", &PyUpdater::verify,
           "Checks the engines against the last update (needs verify=True).")
      .def("close", &PyUpdater::close, "Asks the engines to leave this updater's groups.");
}

// The read-only properties, and the context manager (leaving it closes the updater).
void bind_properties(py::class_<PyUpdater>& c) {
  c.def_property_readonly("closed", &PyUpdater::closed)
      .def_property_readonly("selector", &PyUpdater::selector)
      .def_property_readonly("engines", &PyUpdater::engines)
      .def_property_readonly(
          "backend",
          [](const PyUpdater& u) { return std::string(sync::to_string(u.options().backend)); })
      .def_property_readonly("bucket_bytes",
                             [](const PyUpdater& u) { return u.options().buckets.bucket_bytes; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyUpdater& u, py::args) {
        u.close();
        return false;
      });
}

void bind_updater(py::module_& m) {
  py::class_<PyUpdater> c(m, "DistributedUpdater",
                          "Pushes a trainer's weights to rollout engines, one update per call.");
  bind_constructor(c);
  bind_methods(c);
  bind_properties(c);
}

}  // namespace
}  // namespace weightcast::python

PYBIND11_MODULE(_weightcast, m) {
  namespace wp = weightcast::python;
  m.doc() = "weightcast: push a Python trainer's weights to rollout engines";
  m.attr("__version__") = WEIGHTCAST_VERSION;
  wp::register_errors(m);
  wp::bind_receiver(m);
  wp::bind_session_machine(m);
  wp::bind_colocate(m);
  wp::bind_store(m);
  wp::bind_report(m);
  wp::bind_stage_result(m);
  m.def("weight_update_selector", &wp::selector_of, py::kw_only(),
        py::arg("speculative_algorithm") = py::none(), py::arg("mtp_num_layers") = py::none(),
        py::arg("megatron_to_hf_mode") = py::none(),
        "The selector of every update session: 'target' when a speculative algorithm is on, no "
        "MTP layers are trained and the conversion is not 'bridge'; 'all' otherwise.");
  wp::bind_updater(m);
  wp::bind_shard_plan(m);
}

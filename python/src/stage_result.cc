#include "stage_result.h"

#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "comm/errors.h"

namespace py = pybind11;
using nlohmann::json;

namespace weightcast::python {

std::string StageResult::failure() const {
  const std::string where = "stage " + std::to_string(stage) + ": ";
  if (local != Local::kNone) return where + error;
  if (!sent) return where + "nothing sent";
  if (result.ok) return "";
  if (!result.error.empty()) return where + result.error;
  if (!result.failures.empty()) return where + sync::trainer::to_string(result.failures.front());
  return where + "failed";
}

std::string to_json(const StageResult& o) {
  const auto& r = o.result;
  json failures = json::array();
  for (const auto& f : r.failures) {
    failures.push_back({{"engine", f.engine},
                        {"route", f.route},
                        {"message", f.message},
                        {"unreachable", f.unreachable},
                        {"timed_out", f.timed_out}});
  }
  json j = {{"stage", o.stage},
            {"token", o.token},
            {"sent", o.sent},
            {"local", static_cast<int>(o.local)},
            {"error", o.error},
            {"ok", r.ok},
            {"tensors", r.tensors},
            {"bytes", r.bytes},
            {"buckets", r.buckets},
            {"seconds", r.seconds},
            {"http_wait", r.http_wait_seconds},
            {"pack_wait", r.pack_wait_seconds},
            {"broadcast", r.broadcast_seconds},
            {"send_error", r.error},
            {"failures", failures},
            {"digests", sync::trainer::to_text(o.digests)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StageResult parse_stage_result(std::string_view text) {
  try {
    const json j = json::parse(text);
    StageResult o;
    o.stage = j.at("stage").get<int>();
    o.token = j.at("token").get<std::string>();
    o.sent = j.at("sent").get<bool>();
    const int local = j.at("local").get<int>();
    if (local < 0 || local > static_cast<int>(StageResult::Local::kOther)) {
      throw comm::BadRequestError("stage result: bad local failure kind");
    }
    o.local = static_cast<StageResult::Local>(local);
    o.error = j.at("error").get<std::string>();
    auto& r = o.result;
    r.ok = j.at("ok").get<bool>();
    r.tensors = j.at("tensors").get<std::uint64_t>();
    r.bytes = j.at("bytes").get<std::uint64_t>();
    r.buckets = j.at("buckets").get<std::uint64_t>();
    r.seconds = j.at("seconds").get<double>();
    r.http_wait_seconds = j.at("http_wait").get<double>();
    r.pack_wait_seconds = j.at("pack_wait").get<double>();
    r.broadcast_seconds = j.at("broadcast").get<double>();
    r.error = j.at("send_error").get<std::string>();
    for (const auto& f : j.at("failures")) {
      r.failures.push_back({f.at("engine").get<std::string>(), f.at("route").get<std::string>(),
                            f.at("message").get<std::string>(), f.at("unreachable").get<bool>(),
                            f.at("timed_out").get<bool>()});
    }
    o.digests = sync::trainer::parse_sent_digests(j.at("digests").get<std::string>());
    return o;
  } catch (const json::exception& e) {
    throw comm::BadRequestError(std::string("stage result: ") + e.what());
  }
}

void bind_stage_result(py::module_& m) {
  py::class_<StageResult>(m, "StageResult",
                          "What one pipeline stage's source sent in a session (send_stage()); "
                          "picklable, for the coordinator's finish().")
      .def_property_readonly("stage", [](const StageResult& r) { return r.stage; })
      .def_property_readonly("token", [](const StageResult& r) { return r.token; })
      .def_property_readonly("ok", &StageResult::ok)
      .def_property_readonly("sent", [](const StageResult& r) { return r.sent; })
      .def_property_readonly("error", &StageResult::failure)
      .def_property_readonly("tensors", [](const StageResult& r) { return r.result.tensors; })
      .def_property_readonly("bytes", [](const StageResult& r) { return r.result.bytes; })
      .def_property_readonly("buckets", [](const StageResult& r) { return r.result.buckets; })
      .def_property_readonly("seconds", [](const StageResult& r) { return r.result.seconds; })
      .def_property_readonly(
          "failures",
          [](const StageResult& r) {
            py::list out;
            for (const auto& f : r.result.failures) {
              out.append(py::dict(py::arg("engine") = f.engine, py::arg("route") = f.route,
                                  py::arg("message") = f.message));
            }
            return out;
          })
      .def("to_json", &to_json, "The result as one JSON text (for transports that move str).")
      .def_static("from_json", &parse_stage_result, py::arg("text"))
      .def(py::pickle([](const StageResult& r) { return py::make_tuple(to_json(r)); },
                      [](const py::tuple& state) {
                        if (state.size() != 1) throw comm::BadRequestError("stage result state");
                        return parse_stage_result(state[0].cast<std::string>());
                      }))
      .def("__repr__", [](const StageResult& r) {
        const std::string status = r.ok() ? "ok" : r.failure();
        return "<weightcast.StageResult stage " + std::to_string(r.stage) + " " +
               std::to_string(r.result.tensors) + " tensors " + std::to_string(r.result.bytes) +
               " bytes " + status + ">";
      });
}

}  // namespace weightcast::python

#include "stage_result.h"

#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/trainer/stage_outcome.h"

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
  json j = sync::trainer::stage_outcome_json({o.sent, o.error, o.result, o.digests});
  j["stage"] = o.stage;
  j["token"] = o.token;
  // The stage outcome's own "error" is the local failure; "local" says what kind it was.
  j["local"] = static_cast<int>(o.local);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StageResult parse_stage_result(std::string_view text) {
  try {
    const json j = json::parse(text);
    sync::trainer::StageOutcome base = sync::trainer::stage_outcome_from_json(j);
    StageResult o;
    o.stage = j.at("stage").get<int>();
    o.token = j.at("token").get<std::string>();
    const int local = j.at("local").get<int>();
    if (local < 0 || local > static_cast<int>(StageResult::Local::kOther)) {
      throw comm::BadRequestError("stage result: bad local failure kind");
    }
    o.local = static_cast<StageResult::Local>(local);
    o.sent = base.sent;
    o.error = std::move(base.error);
    o.result = std::move(base.result);
    o.digests = std::move(base.digests);
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

#include "report_binding.h"

#include <pybind11/stl.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>

namespace py = pybind11;

namespace weightcast::python {

namespace {

using sync::trainer::EngineFailure;
using sync::trainer::PhaseSeconds;

// The Python dict keys of a report struct's fields, one (key, member pointer) entry per field, in
// the struct's order: an array where the fields share a type, a tuple where they do not.
constexpr std::array kPhaseFields = {
    std::pair{"prepare", &PhaseSeconds::prepare}, std::pair{"pause", &PhaseSeconds::pause},
    std::pair{"begin", &PhaseSeconds::begin},     std::pair{"data", &PhaseSeconds::data},
    std::pair{"commit", &PhaseSeconds::commit},   std::pair{"resume", &PhaseSeconds::resume},
};
constexpr std::tuple kFailureFields = {
    std::pair{"engine", &EngineFailure::engine},
    std::pair{"route", &EngineFailure::route},
    std::pair{"message", &EngineFailure::message},
    std::pair{"unreachable", &EngineFailure::unreachable},
    std::pair{"timed_out", &EngineFailure::timed_out},
};

// `s` as a dict, one item per entry of `fields` (kPhaseFields, kFailureFields).
template <typename S, typename Fields>
py::dict to_dict(const S& s, const Fields& fields) {
  py::dict d;
  std::apply([&](const auto&... entry) { ((d[entry.first] = s.*entry.second), ...); }, fields);
  return d;
}

py::list failures_list(const std::vector<EngineFailure>& failures) {
  py::list out;
  for (const auto& f : failures) out.append(to_dict(f, kFailureFields));
  return out;
}

template <typename T>
auto field(T sync::trainer::UpdateReport::*member) {
  return [member](const Report& r) { return r.base.*member; };
}

}  // namespace

void bind_report(py::module_& m) {
  py::class_<Report>(m, "UpdateReport", "What one update() did, or why it failed.")
      .def_property_readonly("ok", field(&sync::trainer::UpdateReport::ok))
      .def_property_readonly("version", field(&sync::trainer::UpdateReport::version))
      .def_property_readonly(
          "selector", [](const Report& r) { return std::string(sync::to_string(r.base.selector)); })
      .def_property_readonly("adapter", field(&sync::trainer::UpdateReport::adapter),
                             "An adapter update's lora_name; empty for the base weights.")
      .def_property_readonly("tensors", field(&sync::trainer::UpdateReport::tensors))
      .def_property_readonly("bytes", field(&sync::trainer::UpdateReport::bytes))
      .def_property_readonly("buckets", field(&sync::trainer::UpdateReport::buckets))
      .def_property_readonly("wire_bytes", field(&sync::trainer::UpdateReport::wire_bytes))
      .def_property_readonly("delta_buckets", field(&sync::trainer::UpdateReport::delta_buckets))
      .def_property_readonly("data_path", field(&sync::trainer::UpdateReport::data_path))
      .def_property_readonly("seconds", field(&sync::trainer::UpdateReport::seconds))
      .def_property_readonly("gbps", [](const Report& r) { return r.base.gbps(); })
      .def_property_readonly("phases",
                             [](const Report& r) { return to_dict(r.base.phases, kPhaseFields); })
      .def_property_readonly("http_wait_seconds",
                             field(&sync::trainer::UpdateReport::http_wait_seconds))
      .def_property_readonly("pack_wait_seconds",
                             field(&sync::trainer::UpdateReport::pack_wait_seconds))
      .def_property_readonly("error", field(&sync::trainer::UpdateReport::error))
      .def_property_readonly("failed_engine", field(&sync::trainer::UpdateReport::failed_engine))
      .def_property_readonly("failed_route", field(&sync::trainer::UpdateReport::failed_route))
      .def_property_readonly("failures",
                             [](const Report& r) { return failures_list(r.base.failures); })
      .def_property_readonly("needs_reload", field(&sync::trainer::UpdateReport::needs_reload))
      .def_property_readonly("dropped",
                             [](const Report& r) {
                               std::vector<std::pair<std::string, std::string>> out;
                               for (const auto& d : r.base.dropped)
                                 out.emplace_back(d.engine, d.why);
                               return out;
                             })
      .def_property_readonly("engines_current",
                             field(&sync::trainer::UpdateReport::engines_current))
      .def_property_readonly("out", field(&sync::trainer::UpdateReport::out))
      .def_property_readonly("verified", [](const Report& r) { return r.verified; })
      .def("__str__", [](const Report& r) { return sync::trainer::summary(r.base); })
      .def("__repr__", [](const Report& r) {
        return "<weightcast.UpdateReport " + sync::trainer::summary(r.base) + ">";
      });
}

py::object to_python(Report report) {
  return py::cast(std::move(report));
}

}  // namespace weightcast::python

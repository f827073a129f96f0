// weightcast.UpdateReport: the C++ UpdateReport as a read-only Python object, plus whether the
// update was verified.
// Lifetime: plain values, copied into Python. Threading: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "sync/trainer/report.h"

namespace weightcast::python {

struct Report {
  sync::trainer::UpdateReport base;
  std::optional<bool> verified;  // unset: not checked
};

void bind_report(pybind11::module_& m);
pybind11::object to_python(Report report);

}  // namespace weightcast::python

// A torch-compatible c10d store server for Python (comm/store/c10d_store_server.h), as
// weightcast._weightcast._C10dStoreServer: the torch reference engine's front keeps its workers'
// TP-group store with it, so the front itself never imports torch (each import costs seconds of
// an engine's start).
// Lifetime/threading: serves from its own threads until stop() or the object's end.
#pragma once

#include <pybind11/pybind11.h>

namespace weightcast::python {

void bind_store(pybind11::module_& m);

}  // namespace weightcast::python

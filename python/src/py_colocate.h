// The colocated path's trainer end for Python (docs/colocated.md): one bucket laid out in a
// sealed memfd segment (comm/colocate/segment.h) and served on an abstract unix socket
// (comm/colocate/segment_server.h) to the engine ranks that copy it, as
// weightcast._weightcast._ColocatedBucket. Used by tests and by Python trainers that speak
// POST /update_weights_from_tensor themselves. Also _cuda_device_count (what colocate_memory="cuda"
// needs).
// Lifetime/threading: the bucket lives as long as the Python object; serve() releases the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace weightcast::python {

void bind_colocate(pybind11::module_& m);

}  // namespace weightcast::python

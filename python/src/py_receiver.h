// The engine side in Python: _weightcast.Receiver over sync::engine::Receiver (one engine rank).
//
// The binding hands runners' `load` callbacks a list of (name, dtype name, shape, memoryview)
// per layer, where each memoryview is a writable view of the staged bytes (zero copy, valid only
// during the call); weightcast/receiver.py turns them into torch tensors. Control-plane calls take
// the JSON bodies the HTTP routes carry, so an engine's HTTP front relays them unchanged.
// Blocking calls (join, receive, commit) release the GIL; callbacks take it back.
// Exceptions: ReceiverError (.status, the control plane's HTTP status) and LoadError
// (.runner, .tensor), both weightcast.Error subclasses.
// Lifetime: the module's. Threading: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

namespace weightcast::python {

void bind_receiver(pybind11::module_& m);

}  // namespace weightcast::python

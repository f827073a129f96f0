// The engine side's one session state machine (sync/engine/control/session.h), bound for Python
// engines whose control plane fronts several workers (the torch reference engine's HTTP front):
// the same rules and words as weightcast-engine and every Receiver, not a copy of them.
// Lifetime/threading: see the class; the caller serializes calls (the front holds its lock).
#pragma once

#include <pybind11/pybind11.h>

namespace weightcast::python {

// weightcast._weightcast.SessionMachine; a refusal raises ReceiverError with its HTTP status.
void bind_session_machine(pybind11::module_& m);

}  // namespace weightcast::python

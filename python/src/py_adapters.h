// The Receiver's adapters for Python (docs/lora.md): what a committed adapter session swapped in,
// read by an engine that applies adapters in its forward (the torch reference engine), and the
// begin's "lora" object parsed as weightcast-engine parses it.
// Lifetime/threading: as the Receiver binding (py_receiver.h); calls take the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "sync/engine/commit/receiver.h"
#include "sync/engine/lora/adapter_session.h"

namespace weightcast::python {

// begin_weight_update's "lora" object as JSON text ({lora_name, config, op}): the adapter it
// names. ReceiverError 400 naming the field otherwise.
sync::engine::AdapterTarget parse_adapter_begin(const std::string& lora_json);

// adapter(name), adapter_names(), unload_adapter(name), adapter_checksum(name) on the class, and
// _fill_tensor(name, dtype, shape, seed, step) on the module: the generator's bytes of any tensor
// (sync/model/model.h's fill_tensor), e.g. weightcast-train --lora-rank's adapter at step k.
void bind_receiver_adapters(pybind11::module_& m, pybind11::class_<sync::engine::Receiver>& cls);

}  // namespace weightcast::python

// Shard plans for Python (sync/model/shard_plan.h): the hand-written tensor-parallel plan of a
// model and the checks a plan must pass, as JSON text in and out.
// Threading: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

namespace weightcast::python {

// _tensor_parallel_plan(spec_json, runner, tp_size, tp_rank, ep_size, placement) -> plan JSON;
// _validate_shard_plans(spec_json, runner, [plan JSON per rank]) -> None or BadRequestError;
// _tensor_shapes(spec_json, runner) -> {HF name: full shape} of the model's tensors.
void bind_shard_plan(pybind11::module_& m);

}  // namespace weightcast::python

#include "py_shard_plan.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/model.h"
#include "sync/model/shard_plan.h"
#include "sync/model/tensor_parallel_plan.h"

namespace py = pybind11;

namespace weightcast::python {
namespace {

// The tensors of `runner` ("target", "draft" or "all") of the model `spec_json` describes.
std::vector<sync::TensorMeta> runner_tensors(const sync::ModelSpec& spec,
                                             const std::string& runner) {
  if (runner == "target") return sync::target_tensors(spec);
  if (runner == "draft") return sync::draft_tensors(spec);
  if (runner == "all") return sync::hf_tensors(spec);
  throw comm::ConfigError("runner must be 'target', 'draft' or 'all' (got '" + runner + "')");
}

sync::ModelSpec spec_from(const std::string& spec_json) {
  return sync::model_spec_from_json(nlohmann::json::parse(spec_json));
}

std::string tensor_parallel_plan(const std::string& spec_json, const std::string& runner,
                                 int tp_size, int tp_rank, int ep_size,
                                 const std::string& placement) {
  const sync::ModelSpec spec = spec_from(spec_json);
  const sync::ParallelRank rank{tp_size, tp_rank, ep_size,
                                sync::parse_placement_strategy(placement)};
  return sync::to_json(sync::tensor_parallel_plan(spec, runner_tensors(spec, runner), rank)).dump();
}

std::map<std::string, std::vector<std::int64_t>> tensor_shapes(const std::string& spec_json,
                                                               const std::string& runner) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& t : runner_tensors(spec_from(spec_json), runner)) out[t.name] = t.shape;
  return out;
}

void validate_shard_plans(const std::string& spec_json, const std::string& runner,
                          const std::vector<std::string>& plans_json) {
  const sync::ModelSpec spec = spec_from(spec_json);
  std::vector<sync::ShardPlan> plans;
  for (const auto& text : plans_json) {
    plans.push_back(sync::shard_plan_from_json(nlohmann::json::parse(text)));
  }
  sync::validate_shard_plans(runner_tensors(spec, runner), plans);
}

}  // namespace

void bind_shard_plan(py::module_& m) {
  m.def("_tensor_parallel_plan", &tensor_parallel_plan, py::arg("spec_json"), py::arg("runner"),
        py::arg("tp_size"), py::arg("tp_rank"), py::arg("ep_size") = 1,
        py::arg("placement") = "linear");
  m.def("_tensor_shapes", &tensor_shapes, py::arg("spec_json"), py::arg("runner"));
  m.def("_validate_shard_plans", &validate_shard_plans, py::arg("spec_json"), py::arg("runner"),
        py::arg("plans"));
}

}  // namespace weightcast::python

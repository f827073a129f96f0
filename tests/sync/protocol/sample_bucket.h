// A bucket request with every kind of tensor the protocol tests need: a 2-d and a 1-d tensor, a
// scalar and an empty one, with the optional fields set. Shared by the request tests.
#pragma once

#include "sync/protocol/protocol.h"

namespace weightcast::sync {

inline UpdateWeightsFromDistributedRequest sample_bucket() {
  UpdateWeightsFromDistributedRequest r;
  r.tensors = {{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, {4, 8}},
               {"model.norm.weight", DType::kFloat32, {8}},
               {"lm_head.scale", DType::kFloat8E4M3Fn, {}},
               {"empty", DType::kInt64, {0, 3}}};
  r.group_name = "wc-pp_1";
  r.selector = Selector::kTarget;
  r.sequence = 41;
  r.flush_cache = false;
  r.abort_all_requests = true;
  r.weight_version = "step-7";
  r.torch_empty_cache = true;
  return r;
}

}  // namespace weightcast::sync

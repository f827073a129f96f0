// What a DistributedUpdater checks of its engines' /server_info before any data moves, each a
// comm::ConfigError naming the engine and what it lacks (the updater refuses an engine rather
// than trust it to honour what it cannot): the selector and backend of the updater, the bucket
// layout a group with SGLang engines needs, and adapter sessions for adapter updates.
// Threading: free functions.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "sync/model/shard_plan.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::sync::trainer {

// The engine at `url` (answering `info`) supports `selector` and `backend`.
void check_engine_info(const std::string& url, const ServerInfoResponse& info, Selector selector,
                       Backend backend);

// A group with SGLang engines (the common mode) sends `format`, which every SGLang engine reads.
void check_common_format(std::span<EngineApi* const> engines, LoadFormat format);

// The engine at `url` takes adapter sessions (its /server_info lists lora_adapters; docs/lora.md),
// so an update of adapter `adapter` may go to it.
void check_takes_adapters(const std::string& url, const ServerInfoResponse& info,
                          const std::string& adapter);

// The shard plans the engine at `url` announced (ServerInfoResponse::shard_plans; none: empty),
// parsed; comm::BadRequestError naming the engine and the plan's rank for one that does not parse.
// A tensor every rank's plan says absent (one its loader skips, e.g. a tied lm_head) is left out
// of them all, so it goes whole (check_shard_plans) instead of being refused as kept by no rank.
std::vector<ShardPlan> announced_shard_plans(const std::string& url,
                                             const ServerInfoResponse& info);

// The plans of the engine at `url` (rank i's at index i) describe `tensors`, the tensors one
// stage sends it (validate_shard_plans() on each plan narrowed to those names: a plan may name
// tensors another stage or runner sends). A tensor no rank's plan names goes whole to every rank:
// a plan recorded over the tensors an HF config implies need not know every tensor a loader
// takes. comm::BadRequestError naming the engine and the tensor otherwise: a plan that misses a
// tensor another rank's plan names, slices outside it, or overlaps another rank's slice.
void check_shard_plans(const std::string& url, std::span<const ShardPlan> plans,
                       std::span<const TensorMeta> tensors);

}  // namespace weightcast::sync::trainer

// Slice assembly: the full tensors of an engine process whose ranks each received only their
// slices (shard plans, docs/sharding.md), put together at commit from what the ranks staged.
//
// weightcast-engine holds one copy of the weights for all of its ranks. With shard plans each of
// its ranks joins the groups of its own shard class and stages only its slice of each tensor
// (Staging's distinct staging keeps one copy per distinct content). At commit, per staged tensor:
//   - a rank whose plan says absent may have staged nothing; every other rank must have staged;
//   - a rank that staged the whole tensor (a trainer that does not shard, an adapter or draft
//     session, a tensor no plan names) must hold the same digest as every other whole copy, and
//     a slice staged beside it must equal that slice of it;
//   - a rank that staged a slice must have staged exactly its plan's shape, and ranks that keep
//     the same slice (KV heads shared by a group of ranks) the same bytes;
//   - without a whole copy the slices are unpacked into a full tensor from the receive pool (the
//     plans were checked to cover every index, validate_shard_plans()), and hashed once.
// Each tensor then holds its full meta, bytes and digest for every rank, as whole staging would.
// A rank that did not stage, or whose bytes disagree, fails the commit with a ReceiverError(500)
// naming the rank, runner and tensor; nothing is loaded.
// Lifetime/threading: a pure function over the staged map; runs on the committing thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sync/engine/stage/block_pool.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/shard_plan.h"

namespace weightcast::sync::engine {

// The full shape of `name` in `runner` (what it holds), or nullopt for a tensor it does not hold
// (an adapter's: its staged shape is its full one).
using FullShape =
    std::function<std::optional<std::vector<std::int64_t>>(Runner, const std::string& name)>;

// Puts `staged` together as above. `plans[i]` is local rank i's plan, `first_rank` the engine
// rank of local rank 0 (for messages); with `rehash` every staged copy is hashed again first and
// checked against its digest at receive.
void assemble_slices(std::map<Runner, std::map<std::string, StagedTensor>>& staged,
                     std::span<const ShardPlan> plans, const FullShape& full_shape, BlockPool& pool,
                     bool rehash, int first_rank);

}  // namespace weightcast::sync::engine

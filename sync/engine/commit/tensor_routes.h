// Where each tensor of a bucket request goes in a Receiver: the runners that load it (those the
// session's selector covers whose filter accepts its name, unless it is a routed expert this rank
// does not hold), checked against what each runner holds; and the digests the request carries.
// Lifetime/threading: free functions over the caller's data; the Receiver calls them under its
// lock.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "sync/engine/commit/local_ranks.h"
#include "sync/engine/commit/receiver_loader.h"
#include "sync/model/checksum.h"
#include "sync/protocol/selector.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::engine {

// Per tensor, the runners that load it (empty: none of this rank's). `sent`: the names already
// sent in this session (a name sent twice is refused). Counts the experts this rank drops in
// `dropped`. `slices`: the plan of the ranks the request's group reaches (LocalRanks::plan_of),
// or null: a tensor that arrives narrowed must have exactly the shape that plan keeps of the
// runner's full tensor, and one the plan says is absent is refused. Throws ReceiverError (400)
// naming the tensor by its index.
std::vector<std::vector<Runner>> route_tensors(const std::vector<ReceiverRunner>& runners,
                                               const LocalRanks& ranks, Selector selector,
                                               const std::vector<TensorMeta>& tensors,
                                               const std::unordered_set<std::string>& sent,
                                               std::uint64_t& dropped,
                                               const ShardPlan* slices = nullptr);

// The request's `digests` field, parsed; throws ReceiverError (400) naming a malformed one.
std::vector<Digest> parse_expected_digests(const std::vector<std::string>& digests);

}  // namespace weightcast::sync::engine

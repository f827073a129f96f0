// The engine's side of delta buckets: the base a delta applies to, rebuilt from committed weights.
//
// A delta bucket (sync/protocol/protocol.h, BucketDelta) is `next XOR base`, where base is the
// bucket as the trainer sent it at base_version. The engine holds no copy of it: the base of each
// tensor is that tensor as committed in the first runner it is destined for, with the runner's
// layout undone (a shuffled draft tensor is unshuffled into the buffer), so the bytes are the raw
// ones the trainer sent. Each such tensor is then hashed and compared with the trainer's digest of
// its own base: a delta is applied only to the exact bytes it was computed against. Tensors no
// runner takes (filtered out) are zero-filled and not checked: their bytes are dropped anyway,
// and XOR keeps each byte's decode independent of its neighbours'.
// Lifetime/threading: a pure function over the runner set's shared lock; safe from the unpack
// threads of every rank while no commit runs (commits wait for every bucket of the session).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "sync/engine/receive/receive_pipeline.h"
#include "sync/engine/runners/runner.h"
#include "sync/model/bucket.h"
#include "sync/model/checksum.h"
#include "sync/model/shard_plan.h"

namespace weightcast::sync::engine {

// Writes the base of `plan` into `bucket` (plan.total_bytes long, else EnforceError) as above.
// `expected[i]` is the trainer's digest of entry i's base. `slices`: the shard plan of the ranks
// the bucket's group reaches (docs/sharding.md), or null; an entry that is that plan's slice of
// a tensor gets that slice of the committed tensor (pack_slice()). Returns nullopt when every
// checked tensor matches, else the refusal's message naming the first tensor that does not, both
// digests and both versions.
std::optional<std::string> fill_delta_base(const RunnerSet& runners, const BucketPlan& plan,
                                           const std::vector<std::vector<Runner>>& destinations,
                                           const std::vector<Digest>& expected,
                                           const std::string& base_version,
                                           std::span<std::byte> bucket,
                                           const ShardPlan* slices = nullptr);

// The delta base from an engine that can rebuild the exact bytes a delta was computed against
// from its own weights (weightcast-engine undoes its layout, sync/engine/runners/delta_base.h):
// writes the base of `plan` into `bucket`, checked against the trainer's `expected` digests; a
// refusal message naming the first tensor that does not match. With one, the receiver keeps no
// copy. `slices`: as fill_delta_base()'s.
using DeltaBaseSource = std::function<std::optional<std::string>(
    const BucketPlan& plan, const std::vector<std::vector<Runner>>& destinations,
    const std::vector<Digest>& expected, const std::string& base_version,
    std::span<std::byte> bucket, const ShardPlan* slices)>;

// The DeltaSpec of a delta bucket request for an engine holding `held_version`, its base written
// by `source`: a refusal when the delta is against another version or no base is held (409), or
// when its payload is over `max_wire_bytes` or its digests do not parse (400).
std::variant<Refusal, std::shared_ptr<const DeltaSpec>> make_delta_spec(
    const BucketDelta& delta, const std::string& held_version, bool has_base,
    std::size_t max_wire_bytes, DeltaBaseSource source, const ShardPlan* slices = nullptr);

}  // namespace weightcast::sync::engine

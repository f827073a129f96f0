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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sync/engine/runner.h"
#include "sync/model/bucket.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::engine {

// Writes the base of `plan` into `bucket` (plan.total_bytes long, else EnforceError) as above.
// `expected[i]` is the trainer's digest of entry i's base. Returns nullopt when every checked
// tensor matches, else the refusal's message naming the first tensor that does not, both
// digests and both versions.
std::optional<std::string> fill_delta_base(const RunnerSet& runners, const BucketPlan& plan,
                                           const std::vector<std::vector<Runner>>& destinations,
                                           const std::vector<Digest>& expected,
                                           const std::string& base_version,
                                           std::span<std::byte> bucket);

}  // namespace weightcast::sync::engine

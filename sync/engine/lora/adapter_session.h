// What an adapter session adds to the Receiver's session (docs/lora.md): the adapter it updates,
// how its bucket tensors are routed, and how its commit builds the adapter the AdapterStore
// swaps in.
//
// An adapter session is a session of selector "target" opened with an AdapterTarget. Its buckets
// carry only the adapter's LoRA tensors (PEFT names of modules the config targets); they are
// staged and digest-checked as any bucket, and the commit builds one Adapter from them, checked
// against the target's base weights (check_adapter), instead of loading any runner: no runner's
// load or finish runs, so neither the target's weights nor the draft can change.
// Errors: ReceiverError with the control plane's status, naming the tensor or the field.
// Deltas: an adapter session's bucket may be a delta against the adapter held under its name
// (adapter_base_source), never against the base weights.
// Threading: free functions; the Receiver calls them under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/lora/adapter_store.h"
#include "sync/engine/runners/delta_base.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/lora.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync::engine {

struct AdapterTarget {
  std::string name;
  LoraConfig config;
  AdapterStore::Put put = AdapterStore::Put::kLoad;
};

// The adapter a begin's "lora" object names (its config parsed). comm::BadRequestError naming
// the field ("lora.config: ...") when the config is not PEFT's.
AdapterTarget adapter_target(const LoraBegin& begin);

// Refuses (400) an adapter session of any selector but target, or with a bad name.
void check_adapter_begin(Selector selector, const AdapterTarget& target);

// One destination per tensor (the target runner's staging), or a 400 naming the first tensor
// that is not a LoRA tensor of a targeted module or was already sent in this session.
std::vector<std::vector<Runner>> route_adapter_tensors(const AdapterTarget& target,
                                                       const std::vector<TensorMeta>& tensors,
                                                       const std::unordered_set<std::string>& sent);

// The delta base of an adapter session's buckets (sync/engine/runners/delta_base.h): each entry's
// base is the tensor of that name in `held`, the adapter held under the session's name (immutable,
// so the source may run after the lock is let go), checked against the trainer's digest of its
// own base. A refusal names the first tensor `held` lacks, holds at another size, or holds with
// another digest. `held` null: every delta refused.
DeltaBaseSource adapter_base_source(std::shared_ptr<const Adapter> held);

// The adapter a committed session holds: rank 0's staged bytes and digests, checked against the
// base weight shapes `target` reports (its shape_of). 400 naming the tensor when it is not an
// adapter of `target.config` over that base, or when the target runner reports no shapes.
std::shared_ptr<const Adapter> build_adapter(const AdapterTarget& target,
                                             const std::map<std::string, StagedTensor>& staged,
                                             const ReceiverRunner* runner,
                                             const std::string& version);

}  // namespace weightcast::sync::engine

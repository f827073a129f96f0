// Shard classes (docs/sharding.md): the engine ranks that keep the same bytes of every tensor,
// so one broadcast of those bytes serves them all.
//
// Engines that announced shard plans (ServerInfoResponse::shard_plans) have each rank in the
// class of its plan (ShardPlan::class_key()): rank k of every TP-n engine that shards alike falls
// in one class, and engines of another TP size in others. Engines without plans form the full
// class: every rank receives every tensor whole, as without sharding.
// SliceSource makes a class's tensors out of a stage's full tensors: a slice as a view of its full
// tensor (SliceView, sync/trainer/tensors.h) that the sender digests run by run and packs straight
// into its bucket buffer (pack_slice(), one memcpy per contiguous run), so the class keeps no
// copy of its slices; a replicated tensor (or one the plan does not name) borrowed as it is, an
// absent one left out.
// Lifetime: a SliceSource's tensors() view its own SliceViews and the full tensors it was given;
// both must outlive the send. Threading: ShardClass values are plain; SliceSource::await() may be
// called from several threads at once (the sender's packer and digest threads).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/deadline.h"
#include "comm/non_copyable.h"
#include "sync/model/shard_plan.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

// Whether a trainer sends each engine rank only its slice. kAuto: to the engines that announce
// shard plans (native mode; the others get whole tensors in the same update). kOff: every
// engine gets whole tensors, and announced plans are not checked.
enum class ShardMode { kAuto, kOff };
std::string_view to_string(ShardMode mode);
// "auto" or "off"; comm::ConfigError otherwise.
ShardMode parse_shard_mode(std::string_view text);

struct ShardClass {
  struct Member {
    std::size_t engine = 0;  // index into the updater's engines
    std::vector<int> ranks;  // its engine ranks in this class, ascending; all of them when full
    bool operator==(const Member&) const = default;
  };
  std::string key;  // ShardPlan::class_key(), or "full"
  bool full = false;
  ShardPlan plan;  // empty when full
  std::vector<Member> members;
  bool operator==(const ShardClass&) const = default;
};

// The classes of `members` (engine indices, in order): plans[e] holds engine e's plans, one per
// rank (empty: it announced none), rank_counts[e] its rank count. The full class (if any engine
// has no plan) comes first, then the plan classes in the order their first rank appears.
std::vector<ShardClass> shard_classes(std::span<const std::size_t> members,
                                      const std::vector<std::vector<ShardPlan>>& plans,
                                      std::span<const int> rank_counts);

// One class's view of one stage's tensors (see above).
class SliceSource : comm::NonCopyable {
 public:
  using Await = std::function<void(const std::string& name, comm::Deadline deadline)>;

  // Takes `full` (the stage's tensors, borrowed) for `cls`; `await_full` (may be empty) is the
  // stage's own wait for a tensor's bytes. With `whole`, every tensor goes whole (an adapter or
  // draft session: the plans describe the target's loader). Returns the class's tensors, in the
  // stage's order; a view's bytes are readable once await() returned for its name.
  std::span<const NamedTensor> reset(const ShardClass& cls, std::span<const NamedTensor> full,
                                     Await await_full, bool whole);
  // What send_buckets() calls before reading a tensor's bytes: the stage's own wait for the
  // full tensor.
  void await(const std::string& name, comm::Deadline deadline);
  // Bytes of this class's tensors (slices and replicated ones) in the last reset().
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<NamedTensor> tensors_;
  std::vector<SliceView> views_;  // what the slices of tensors_ point at
  Await await_full_;
  std::size_t bytes_ = 0;
};

}  // namespace weightcast::sync::trainer

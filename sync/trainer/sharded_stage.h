// ShardedStage: the data plane of one pipeline stage when engines announce shard plans
// (docs/sharding.md): one group per shard class (sync/trainer/shard_classes.h), each carrying its
// class's slices of the stage's tensors, all classes at once.
//
// A class group holds the trainer's source (rank 0) and, of each member engine, the ranks of that
// class (InitWeightsUpdateGroupRequest::ranks); engines without plans share the full class's
// group, all ranks, whole tensors. Every class goes through send_buckets() with its own tensors
// (SliceSource: slices packed on demand, replicated tensors as they are), its own delta base per
// adapter name ("" for the base weights) and its own pack buffers, on its own thread; the results
// are merged: one class failing fails the stage (its group is broken and re-formed before the
// next update), so the session aborts and no engine commits. An adapter session sends every
// tensor whole to every class (adapters are not in the plans).
// Lifetime: owns its groups; destroy() asks their live members to leave. Threading: one caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/non_copyable.h"
#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/delta_source.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/group.h"
#include "sync/trainer/shard_classes.h"

namespace weightcast::sync::trainer {

class ShardedStage : comm::NonCopyable {
 public:
  ShardedStage(DeltaCodec codec, DeltaMode delta);
  ~ShardedStage();

  // Forms the groups of `classes` (engine indices into `engines`) that are missing, broken, of
  // another membership or of an older `epoch`, and destroys those of classes that are gone.
  // `options` is the stage group's; each class group is named "<options.name>-c<key>".
  // `alive(e)`: whether engine e may be asked to leave a group (not dropped).
  void ensure(const std::vector<ShardClass>& classes, std::span<EngineApi* const> engines,
              const GroupOptions& options, std::uint64_t epoch,
              const std::function<bool(std::size_t)>& alive);

  // Sends `tensors` to every class (see above). `slot(e)`: engine e's member index in `session`.
  // `adapter`: the adapter's name in an adapter session (tensors go whole), else empty; `whole`:
  // every tensor goes whole anyway (a session that updates the draft alone). Unless delta
  // updates are off, each class keeps its own bases per adapter name, and for whole tensors
  // apart from sliced ones.
  BucketSendResult send(const UpdateSession& session, std::span<EngineApi* const> engines,
                        std::span<const NamedTensor> tensors, BucketSendOptions options,
                        const std::function<std::size_t(std::size_t)>& slot,
                        const std::string& adapter, bool whole = false);

  // Every class group's members that are alive leave it; the groups are torn down.
  void destroy(std::span<EngineApi* const> engines, const std::function<bool(std::size_t)>& alive);

  std::size_t classes() const { return groups_.size(); }

 private:
  struct ClassGroup;
  std::vector<std::unique_ptr<ClassGroup>> groups_;
  const DeltaCodec codec_;
  const DeltaMode delta_;
};

}  // namespace weightcast::sync::trainer

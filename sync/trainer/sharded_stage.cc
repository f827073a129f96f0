#include "sync/trainer/sharded_stage.h"

#include <algorithm>
#include <future>
#include <utility>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

struct ShardedStage::ClassGroup {
  ShardClass cls;
  std::uint64_t epoch = 0;
  std::unique_ptr<WeightGroup> group;
  SliceSource source;
  std::shared_ptr<PackBuffers> buffers = std::make_shared<PackBuffers>();
  std::map<std::string, std::unique_ptr<DeltaSource>>
      deltas;  // "": sliced base weights; "whole"; "adapter NAME"

  std::vector<EngineApi*> members(std::span<EngineApi* const> engines,
                                  const std::function<bool(std::size_t)>& alive) const {
    std::vector<EngineApi*> out;
    for (const auto& m : cls.members) {
      if (!alive || alive(m.engine)) out.push_back(engines[m.engine]);
    }
    return out;
  }
};

ShardedStage::ShardedStage(DeltaCodec codec, DeltaMode delta) : codec_(codec), delta_(delta) {}

ShardedStage::~ShardedStage() = default;

void ShardedStage::ensure(const std::vector<ShardClass>& classes,
                          std::span<EngineApi* const> engines, const GroupOptions& options,
                          std::uint64_t epoch, const std::function<bool(std::size_t)>& alive) {
  std::vector<std::unique_ptr<ClassGroup>> kept;
  for (const ShardClass& cls : classes) {
    auto it = std::find_if(groups_.begin(), groups_.end(),
                           [&](const auto& g) { return g && g->cls.key == cls.key; });
    std::unique_ptr<ClassGroup> g;
    if (it != groups_.end()) g = std::move(*it);
    if (!g) g = std::make_unique<ClassGroup>();
    const bool current = g->group && !g->group->broken() && g->epoch == epoch && g->cls == cls;
    if (!current) {
      if (g->group) g->group->destroy(g->members(engines, alive));
      g->group.reset();
      g->cls = cls;
      GroupOptions opts = options;
      opts.name += "-c" + cls.key;
      opts.name_rendezvous.clear();
      opts.ranks.clear();
      std::vector<int> counts;
      std::vector<EngineApi*> members;
      for (const auto& m : cls.members) {
        members.push_back(engines[m.engine]);
        counts.push_back(static_cast<int>(m.ranks.size()));
        opts.name_rendezvous.push_back(true);
        opts.ranks.push_back(m.ranks);
      }
      g->group = WeightGroup::create(members, counts, opts);
      g->epoch = epoch;
    }
    kept.push_back(std::move(g));
  }
  for (auto& g : groups_) {  // classes that are gone
    if (g && g->group) g->group->destroy(g->members(engines, alive));
  }
  groups_ = std::move(kept);
}

BucketSendResult ShardedStage::send(const UpdateSession& session,
                                    std::span<EngineApi* const> engines,
                                    std::span<const NamedTensor> tensors, BucketSendOptions options,
                                    const std::function<std::size_t(std::size_t)>& slot,
                                    const std::string& adapter, bool whole) {
  WC_ENFORCE(!groups_.empty(), "ShardedStage::ensure() first");
  BucketSendResult result;
  std::unordered_map<std::string, const NamedTensor*> by_name;
  index_tensors(tensors, by_name, result);  // the stage's tensors, counted once
  const auto await_full = std::move(options.await_tensor);
  std::vector<std::future<BucketSendResult>> sends;
  for (auto& g : groups_) {
    BucketSendOptions opts = options;
    const auto part = g->source.reset(g->cls, tensors, await_full, whole || !adapter.empty());
    opts.await_tensor = [source = &g->source](const std::string& name, comm::Deadline d) {
      source->await(name, d);
    };
    opts.pack_buffers = g->buffers;
    opts.delta = nullptr;
    if (delta_ != DeltaMode::kOff) {
      // Bases of whole tensors apart from the sliced ones: a name may travel either way.
      auto& source = g->deltas[!adapter.empty() ? "adapter " + adapter : whole ? "whole" : ""];
      if (!source) source = std::make_unique<DeltaSource>(codec_, delta_);
      opts.delta = source.get();
    }
    std::vector<EngineApi*> members;
    std::vector<std::size_t> slots;
    for (const auto& m : g->cls.members) {
      members.push_back(engines[m.engine]);
      slots.push_back(slot(m.engine));
    }
    sends.push_back(
        std::async(std::launch::async, [&session, g = g.get(), part, opts,
                                        members = std::move(members), slots = std::move(slots)] {
          BucketSendResult r =
              send_buckets(session, g->group->name(), g->group->comm(), members, part, opts, slots);
          r.data_path = std::string(g->group->comm().data_path());
          return r;
        }));
  }
  bool first = true;
  for (auto& f : sends) {
    BucketSendResult r = f.get();
    r.tensors = 0;  // the stage's, counted above
    r.bytes = 0;
    if (first) {
      result.data_path = r.data_path;
      r.data_path.clear();
      first = false;
    }
    merge_parallel(result, std::move(r));
  }
  return result;
}

void ShardedStage::destroy(std::span<EngineApi* const> engines,
                           const std::function<bool(std::size_t)>& alive) {
  for (auto& g : groups_) {
    if (g->group) g->group->destroy(g->members(engines, alive));
  }
  groups_.clear();
}

}  // namespace weightcast::sync::trainer

#include "sync/trainer/shard_classes.h"

#include <map>
#include <numeric>
#include <utility>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

std::string_view to_string(ShardMode mode) {
  return mode == ShardMode::kOff ? "off" : "auto";
}

ShardMode parse_shard_mode(std::string_view text) {
  if (text == "auto") return ShardMode::kAuto;
  if (text == "off") return ShardMode::kOff;
  throw comm::ConfigError("shard mode: '" + std::string(text) + "' (expected auto or off)");
}

std::vector<ShardClass> shard_classes(std::span<const std::size_t> members,
                                      const std::vector<std::vector<ShardPlan>>& plans,
                                      std::span<const int> rank_counts) {
  std::vector<ShardClass> out;
  ShardClass full;
  full.key = "full";
  full.full = true;
  std::map<std::string, std::size_t> by_key;  // key -> index in out
  for (std::size_t e : members) {
    WC_ENFORCE_LT(e, plans.size());
    WC_ENFORCE_LT(e, rank_counts.size());
    const auto& engine_plans = plans[e];
    if (engine_plans.empty()) {
      ShardClass::Member m{e, std::vector<int>(static_cast<std::size_t>(rank_counts[e]))};
      std::iota(m.ranks.begin(), m.ranks.end(), 0);
      full.members.push_back(std::move(m));
      continue;
    }
    WC_ENFORCE_EQ(engine_plans.size(), static_cast<std::size_t>(rank_counts[e]),
                  "one shard plan per engine rank");
    for (std::size_t r = 0; r < engine_plans.size(); ++r) {
      const std::string key = engine_plans[r].class_key();
      auto [it, added] = by_key.emplace(key, out.size());
      if (added) out.push_back({key, false, engine_plans[r], {}});
      auto& cls = out[it->second];
      if (cls.members.empty() || cls.members.back().engine != e) cls.members.push_back({e, {}});
      cls.members.back().ranks.push_back(static_cast<int>(r));
    }
  }
  if (!full.members.empty()) out.insert(out.begin(), std::move(full));
  return out;
}

std::span<const NamedTensor> SliceSource::reset(const ShardClass& cls,
                                                std::span<const NamedTensor> full, Await await_full,
                                                bool whole) {
  tensors_.clear();
  views_.clear();
  views_.reserve(full.size());  // the tensors point into it: never reallocated below
  await_full_ = std::move(await_full);
  bytes_ = 0;
  for (const NamedTensor& t : full) {
    // A tensor the plan does not name goes whole (check_shard_plans: no rank of the engine
    // names it).
    const TensorSlice* slice = cls.full || whole ? nullptr : cls.plan.find(t.meta.name);
    if (slice != nullptr && slice->kind == TensorSlice::Kind::kAbsent) continue;
    if (slice == nullptr || slice->kind == TensorSlice::Kind::kReplicated) {
      tensors_.push_back(t);
      bytes_ += t.bytes.size();
      continue;
    }
    WC_ENFORCE(t.view == nullptr, "tensor '", t.meta.name, "' is a slice view already");
    views_.push_back(SliceView{t.meta, *slice, t.bytes});
    NamedTensor part{t.meta, {}, nullptr, &views_.back()};
    part.meta.shape = sliced_shape(t.meta, *slice);
    bytes_ += part.meta.byte_count();
    tensors_.push_back(std::move(part));
  }
  return tensors_;
}

void SliceSource::await(const std::string& name, comm::Deadline deadline) {
  if (await_full_) await_full_(name, deadline);
}

}  // namespace weightcast::sync::trainer

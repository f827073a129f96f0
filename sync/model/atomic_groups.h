// Atomic groups: runs of tensors that an engine loads together and that must therefore travel in
// one bucket.
//
// Engines fuse some HF tensors into one parameter when they load them: q/k/v into qkv_proj,
// gate/up into gate_up_proj (per expert too), and DeepSeek's MLA down projections q_a_proj and
// kv_a_proj_with_mqa into fused_qkv_a_proj_with_mqa. SGLang garbled its output when a bucket
// boundary fell between MLA's two (sglang issue 14178): the engine had half a fused weight at the
// end of one bucket. The rule which tensors belong together comes from the model's naming (a
// GroupRule made from its ModelSpec), never from the bucket size; plan_buckets() keeps every
// group whole and refuses, naming the group and its size, a bucket that cannot hold one.
// A group is the span of the tensor list from its first member to its last, so a member list that
// is not contiguous takes what lies between along (the model's own order keeps them adjacent).
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "sync/model/model.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {

struct GroupRule {
  bool fused_qkv = true;      // self_attn.{q,k,v}_proj
  bool gate_up = true;        // {gate,up}_proj of every MLP, expert and shared expert
  bool mla_down = true;       // self_attn.{q_a_proj, kv_a_proj_with_mqa}
  bool whole_expert = false;  // mlp.experts.{e}.{gate,up,down}_proj: one expert, one bucket

  bool operator==(const GroupRule&) const = default;
};

// The groups a model's engines need: all of the fused ones. A mixture of experts or an MLA model
// is what engines fuse most and what breaks when split; dense models get the same rule.
GroupRule group_rule(const ModelSpec& spec);

struct AtomicGroup {
  std::string name;       // "model.layers.3.self_attn.{q_a_proj,kv_a_proj_with_mqa}"
  std::size_t first = 0;  // index of the first member in the tensor list
  std::size_t end = 0;    // one past the last member
  std::size_t bytes = 0;  // sum of the members' byte counts (padding not included)

  bool operator==(const AtomicGroup&) const = default;
};

// The groups of `metas` under `rule`, ordered by `first` and disjoint (groups whose spans overlap
// are merged). Only groups of two or more tensors are listed.
std::vector<AtomicGroup> atomic_groups(std::span<const TensorMeta> metas, const GroupRule& rule);

}  // namespace weightcast::sync

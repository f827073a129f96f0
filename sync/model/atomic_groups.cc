#include "sync/model/atomic_groups.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string_view>

namespace weightcast::sync {
namespace {

struct Member {
  std::string_view suffix;  // how a member's name ends
  std::string_view group;   // the group's name after the common prefix
};

constexpr std::array kQkv = {
    Member{"self_attn.q_proj.weight", "self_attn.{q,k,v}_proj"},
    Member{"self_attn.k_proj.weight", "self_attn.{q,k,v}_proj"},
    Member{"self_attn.v_proj.weight", "self_attn.{q,k,v}_proj"},
};
constexpr std::array kGateUp = {
    Member{"gate_proj.weight", "{gate,up}_proj"},
    Member{"up_proj.weight", "{gate,up}_proj"},
};
constexpr std::array kMlaDown = {
    Member{"self_attn.q_a_proj.weight", "self_attn.{q_a_proj,kv_a_proj_with_mqa}"},
    Member{"self_attn.kv_a_proj_with_mqa.weight", "self_attn.{q_a_proj,kv_a_proj_with_mqa}"},
};

template <std::size_t N>
std::optional<std::string> match(std::string_view name, const std::array<Member, N>& members) {
  for (const Member& m : members) {
    if (name.ends_with(m.suffix)) {
      return std::string(name.substr(0, name.size() - m.suffix.size())) + std::string(m.group);
    }
  }
  return std::nullopt;
}

// "model.layers.3.mlp.experts.17.down_proj.weight" -> "model.layers.3.mlp.experts.17.*"; nullopt
// for a tensor outside an expert.
std::optional<std::string> expert_of(std::string_view name) {
  constexpr std::string_view kExperts = "mlp.experts.";
  const auto at = name.find(kExperts);
  if (at == std::string_view::npos) return std::nullopt;
  const auto dot = name.find('.', at + kExperts.size());
  if (dot == std::string_view::npos || dot == at + kExperts.size()) return std::nullopt;
  return std::string(name.substr(0, dot + 1)) + "*";
}

std::optional<std::string> group_of(std::string_view name, const GroupRule& rule) {
  if (rule.whole_expert) {
    if (auto key = expert_of(name)) return key;
  }
  if (rule.fused_qkv) {
    if (auto key = match(name, kQkv)) return key;
  }
  if (rule.mla_down) {
    if (auto key = match(name, kMlaDown)) return key;
  }
  if (rule.gate_up) {
    if (auto key = match(name, kGateUp)) return key;
  }
  return std::nullopt;
}

}  // namespace

GroupRule group_rule(const ModelSpec& spec) {
  GroupRule rule;
  rule.mla_down = spec.is_mla();
  return rule;
}

std::vector<AtomicGroup> atomic_groups(std::span<const TensorMeta> metas, const GroupRule& rule) {
  struct Span {
    std::size_t first, end, members;
  };
  std::map<std::string, Span> spans;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    auto key = group_of(metas[i].name, rule);
    if (!key) continue;
    auto [it, fresh] = spans.try_emplace(std::move(*key), Span{i, i + 1, 1});
    if (!fresh) {
      it->second.end = i + 1;
      ++it->second.members;
    }
  }
  std::vector<AtomicGroup> out;
  for (const auto& [name, span] : spans) {
    if (span.members >= 2) out.push_back(AtomicGroup{name, span.first, span.end, 0});
  }
  std::ranges::sort(out, {}, &AtomicGroup::first);
  std::vector<AtomicGroup> merged;
  for (AtomicGroup& g : out) {
    if (!merged.empty() && g.first < merged.back().end) {
      merged.back().end = std::max(merged.back().end, g.end);
      merged.back().name += " + " + g.name;
      continue;
    }
    merged.push_back(std::move(g));
  }
  for (AtomicGroup& g : merged) {
    for (std::size_t i = g.first; i < g.end; ++i) g.bytes += metas[i].byte_count();
  }
  return merged;
}

}  // namespace weightcast::sync

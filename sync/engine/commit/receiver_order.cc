#include "sync/engine/commit/receiver_order.h"

#include <algorithm>
#include <charconv>
#include <map>

namespace weightcast::sync::engine {

LoadKey load_key(std::string_view name) {
  constexpr std::string_view kLayers = "layers.";
  for (std::size_t at = name.find(kLayers); at != std::string_view::npos;
       at = name.find(kLayers, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    const std::string_view rest = name.substr(at + kLayers.size());
    std::int64_t layer = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
    if (ec != std::errc() || end == rest.data() || end == rest.data() + rest.size() ||
        *end != '.') {
      continue;
    }
    return {std::string(name.substr(0, at)), 1, layer};
  }
  // Group non-layer tensors with the layers of their top-level prefix ("model.", "mtp.").
  const auto dot = name.find('.');
  std::string prefix = dot == std::string_view::npos ? "" : std::string(name.substr(0, dot + 1));
  // lm_head.* has no prefix of its own: it belongs after "model."'s layers.
  if (prefix == "lm_head.") prefix = "model.";
  const bool embedding = name.find("embed") != std::string_view::npos;
  return {std::move(prefix), embedding ? 0 : 2, -1};
}

std::vector<std::vector<std::size_t>> load_group_indices(std::span<const std::string_view> names) {
  // One map entry per layer, not per name: a commit of an MoE model names thousands of tensors.
  std::map<LoadKey, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < names.size(); ++i) groups[load_key(names[i])].push_back(i);
  std::vector<std::vector<std::size_t>> out;
  out.reserve(groups.size());
  for (auto& [key, group] : groups) out.push_back(std::move(group));
  return out;
}

std::vector<std::vector<std::string>> load_groups(const std::vector<std::string>& names) {
  const std::vector<std::string_view> views(names.begin(), names.end());
  std::vector<std::vector<std::string>> out;
  for (const auto& group : load_group_indices(views)) {
    auto& named = out.emplace_back();
    for (std::size_t i : group) named.push_back(names[i]);
  }
  return out;
}

}  // namespace weightcast::sync::engine

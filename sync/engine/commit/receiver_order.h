// The order in which a Receiver hands committed tensors to a runner's `load`: layer by layer.
//
// Real engines load layer-wise (vLLM's layer-wise reload buffers a layer until every tensor of it
// arrived), so a commit hands tensors over one layer at a time, layers in ascending number.
// Names are HF parameter names: "<prefix>layers.<n>.<rest>" belongs to layer n of its prefix
// ("model.", "mtp.", "draft."); other names go before the layers when they are embeddings and
// after them otherwise (final norms, lm_head), so a model is loaded front to back.
// Staging keeps tensors in name order, where "layers.10" sorts before "layers.2"; this fixes that.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::sync::engine {

// Where a tensor goes in load order; compare with <.
struct LoadKey {
  std::string prefix;  // text before "layers.<n>." (or the whole name's prefix group)
  int band = 0;        // 0 embeddings, 1 layers, 2 the rest
  std::int64_t layer = -1;
  bool operator<(const LoadKey& o) const {
    if (prefix != o.prefix) return prefix < o.prefix;
    if (band != o.band) return band < o.band;
    return layer < o.layer;
  }
  bool operator==(const LoadKey&) const = default;
};

LoadKey load_key(std::string_view name);

// `names` grouped by layer, groups in load order, names within a group in their given order.
std::vector<std::vector<std::string>> load_groups(const std::vector<std::string>& names);
// The same groups as indices into `names`, copying no name.
std::vector<std::vector<std::size_t>> load_group_indices(std::span<const std::string_view> names);

}  // namespace weightcast::sync::engine

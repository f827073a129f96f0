#include "sync/engine/commit/receiver_loader.h"

#include "sync/engine/commit/receiver_order.h"

namespace weightcast::sync::engine {

namespace {

const ReceiverRunner& runner_of(const std::vector<ReceiverRunner>& runners, Runner id) {
  for (const auto& r : runners) {
    if (r.id == id) return r;
  }
  WC_ENFORCE(false, "no runner '", to_string(id), "'");
  return runners.front();
}

// Hands `names` again from the kept base: the previous version, as it was loaded before.
void reload_base(const ReceiverRunner& runner, const std::vector<std::string_view>& names,
                 const ReceiverBase& base) noexcept {
  if (!base.keeps_bytes()) return;
  try {
    for (const auto& group : load_group_indices(names)) {
      std::vector<TensorView> views;
      for (std::size_t i : group) {
        if (const auto* held = base.base_of(names[i])) {
          views.push_back({&held->meta, held->bytes});
        }
      }
      if (!views.empty()) runner.load(views);
    }
  } catch (...) {
    // The commit's own error is the one reported.
  }
}

}  // namespace

void load_views(const ReceiverRunner& runner, const std::vector<TensorView>& views) {
  std::vector<std::string_view> names;
  names.reserve(views.size());
  for (const auto& v : views) names.push_back(v.meta->name);
  if (runner.begin) runner.begin();
  for (const auto& group : load_group_indices(names)) {
    std::vector<TensorView> layer;
    layer.reserve(group.size());
    for (std::size_t i : group) layer.push_back(views[i]);
    runner.load(layer);
  }
  if (runner.finish) runner.finish();
}

std::vector<RunnerUpdateStats> load_staged(
    const std::vector<ReceiverRunner>& runners,
    const std::map<Runner, std::map<std::string, StagedTensor>>& staged, const ReceiverBase& base) {
  std::vector<RunnerUpdateStats> stats;
  // (runner, names handed to it so far) for the rollback of a failed commit; the names are views
  // of `staged`'s keys, and groups are indices: a commit copies no name.
  std::vector<std::pair<const ReceiverRunner*, std::vector<std::string_view>>> loaded;
  for (const auto& [id, tensors] : staged) {
    if (tensors.empty()) continue;
    const ReceiverRunner& runner = runner_of(runners, id);
    if (runner.adopt) {
      stats.push_back({id, tensors.size(), 0});
      continue;
    }
    std::vector<const std::pair<const std::string, StagedTensor>*> entries;
    std::vector<std::string_view> names;
    entries.reserve(tensors.size());
    names.reserve(tensors.size());
    for (const auto& entry : tensors) {
      entries.push_back(&entry);
      names.push_back(entry.first);
    }
    loaded.push_back({&runner, {}});
    loaded.back().second.reserve(tensors.size());
    std::string_view current = names.front();
    try {
      if (runner.begin) runner.begin();
      for (const auto& group : load_group_indices(names)) {
        std::vector<TensorView> views;
        views.reserve(group.size());
        for (std::size_t i : group) {
          const StagedTensor& t = entries[i]->second;
          views.push_back({&t.meta, t.bytes});
          loaded.back().second.push_back(names[i]);
        }
        current = names[group.front()];
        runner.load(views);
      }
      current = {};
      if (runner.finish) runner.finish();
    } catch (const std::exception& e) {
      for (const auto& [r, done] : loaded) reload_base(*r, done, base);
      std::string failed(current);
      if (const auto* known = dynamic_cast<const TensorLoadFailure*>(&e)) failed = known->tensor();
      const std::string what = failed.empty() ? "finish" : "load of tensor '" + failed + "'";
      throw LoadError(
          id, failed,
          "commit: runner '" + std::string(to_string(id)) + "' failed in " + what + ": " +
              e.what() +
              (base.keeps_bytes()
                   ? "; tensors already loaded were loaded again from the kept base"
                   : "; no delta base kept, tensors already loaded keep their new bytes") +
              "; weight_version unchanged");
    }
    stats.push_back({id, tensors.size(), 0});
  }
  return stats;
}

void hand_over(const std::vector<ReceiverRunner>& runners,
               std::map<Runner, std::map<std::string, StagedTensor>>& staged) noexcept {
  for (auto& [id, tensors] : staged) {
    if (tensors.empty()) continue;
    const ReceiverRunner& runner = runner_of(runners, id);
    if (runner.adopt) runner.adopt(std::move(tensors));
  }
}

}  // namespace weightcast::sync::engine

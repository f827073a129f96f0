#include "sync/engine/receiver_loader.h"

#include "sync/engine/receiver_order.h"

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
void reload_base(const ReceiverRunner& runner, const std::vector<std::string>& names,
                 const ReceiverBase& base) noexcept {
  if (!base.keeps_bytes()) return;
  try {
    for (const auto& group : load_groups(names)) {
      std::vector<TensorView> views;
      for (const auto& name : group) {
        if (const auto* held = base.base_of(name)) views.push_back({&held->meta, held->bytes});
      }
      if (!views.empty()) runner.load(views);
    }
  } catch (...) {
    // The commit's own error is the one reported.
  }
}

}  // namespace

void load_views(const ReceiverRunner& runner, const std::vector<TensorView>& views) {
  std::map<std::string, const TensorView*> by_name;
  std::vector<std::string> names;
  for (const auto& v : views) {
    by_name[v.meta->name] = &v;
    names.push_back(v.meta->name);
  }
  if (runner.begin) runner.begin();
  for (const auto& group : load_groups(names)) {
    std::vector<TensorView> layer;
    for (const auto& name : group) layer.push_back(*by_name.at(name));
    runner.load(layer);
  }
  if (runner.finish) runner.finish();
}

std::vector<RunnerUpdateStats> load_staged(
    const std::vector<ReceiverRunner>& runners,
    const std::map<Runner, std::map<std::string, StagedTensor>>& staged, const ReceiverBase& base) {
  std::vector<RunnerUpdateStats> stats;
  // (runner, names handed to it so far) for the rollback of a failed commit.
  std::vector<std::pair<const ReceiverRunner*, std::vector<std::string>>> loaded;
  for (const auto& [id, tensors] : staged) {
    if (tensors.empty()) continue;
    const ReceiverRunner& runner = runner_of(runners, id);
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    loaded.push_back({&runner, {}});
    std::string current = names.front();
    try {
      if (runner.begin) runner.begin();
      for (const auto& group : load_groups(names)) {
        std::vector<TensorView> views;
        for (const auto& name : group) {
          const StagedTensor& t = tensors.at(name);
          views.push_back({&t.meta, t.bytes, &t});
        }
        current = group.front();
        loaded.back().second.insert(loaded.back().second.end(), group.begin(), group.end());
        runner.load(views);
      }
      current.clear();
      if (runner.finish) runner.finish();
    } catch (const std::exception& e) {
      for (const auto& [r, done] : loaded) reload_base(*r, done, base);
      if (const auto* known = dynamic_cast<const TensorLoadFailure*>(&e)) current = known->tensor();
      const std::string what = current.empty() ? "finish" : "load of tensor '" + current + "'";
      throw LoadError(
          id, current,
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

}  // namespace weightcast::sync::engine

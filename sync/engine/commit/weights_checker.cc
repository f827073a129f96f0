#include "sync/engine/commit/weights_checker.h"

#include <nlohmann/json.hpp>

namespace weightcast::sync::engine {

namespace {

using Json = nlohmann::json;

std::map<Runner, Digest> recompute(const RunnerSet& runners, std::string& version) {
  std::map<Runner, Digest> out;
  for (Runner id : runners.runners()) {
    const RunnerChecksum sum = runners.checksum(id, /*recompute=*/true);
    out[id] = sum.combined;
    version = sum.weight_version;
  }
  return out;
}

Reply answer(const std::string& message, const std::map<Runner, Digest>& digests,
             const std::string& version) {
  Json j = {{"success", true}, {"message", message}, {"weight_version", version}};
  Json sums = Json::object();
  for (const auto& [id, digest] : digests) sums[std::string(to_string(id))] = to_string(digest);
  j["checksums"] = std::move(sums);
  return {200, j.dump()};
}

}  // namespace

Reply WeightsChecker::handle(const RunnerSet& runners, const WeightsCheckerRequest& request) {
  std::lock_guard lock(mu_);
  std::string version;
  if (request.action == "checksum") {
    return answer("checksums of the resident weights", recompute(runners, version), version);
  }
  if (request.action == "snapshot") {
    snapshot_ = recompute(runners, version);
    snapshot_version_ = version;
    return answer("snapshot taken", snapshot_, version);
  }
  if (request.action == "compare") {
    if (snapshot_.empty()) {
      return error_reply(400, "action: 'compare' needs a 'snapshot' first");
    }
    const auto now = recompute(runners, version);
    std::string differ;
    for (const auto& [id, digest] : now) {
      auto it = snapshot_.find(id);
      if (it == snapshot_.end() || !(it->second == digest)) {
        differ += (differ.empty() ? "'" : ", '") + std::string(to_string(id)) + "'";
      }
    }
    if (!differ.empty()) {
      return error_reply(400, "compare: runner " + differ +
                                  " differs from the snapshot taken at weight_version '" +
                                  snapshot_version_ + "'");
    }
    return answer("every runner equals the snapshot", now, version);
  }
  return error_reply(400, "action: '" + request.action +
                              "' is not one of checksum, snapshot, compare (reset_tensors is "
                              "refused: it would destroy the committed weights)");
}

}  // namespace weightcast::sync::engine

#include "verify_sent.h"

#include <map>
#include <mutex>

#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/name_filter.h"
#include "sync/trainer/engine_calls.h"

namespace weightcast::python {

void SentRecord::record(sync::Selector selector, std::string version,
                        std::span<const sync::trainer::NamedTensor> tensors) {
  selector_ = selector;
  version_ = std::move(version);
  sent_ = sync::trainer::sent_digests(tensors);
}

void SentRecord::record(sync::Selector selector, std::string version,
                        std::vector<sync::trainer::SentDigest> digests) {
  selector_ = selector;
  version_ = std::move(version);
  sent_ = std::move(digests);
}

std::vector<std::string> SentRecord::check_runner(
    const std::string& url, const sync::RunnerInfo& runner,
    const sync::WeightsChecksumResponse& answer) const {
  std::vector<std::string> problems;
  const std::string where =
      "engine " + url + " runner " + std::string(sync::to_string(runner.name)) + " ";
  if (answer.weight_version != version_) {
    problems.push_back(where + "has weight_version '" + answer.weight_version + "', expected '" +
                       version_ + "'");
  }
  std::map<std::string, std::string> held;
  for (const auto& t : answer.tensors) held[t.name] = t.digest;
  const auto layout = static_cast<int>(sync::parse_layout(runner.layout));
  const auto filter = sync::NameFilter::from_globs(runner.filters, "runner filters");
  for (const auto& sent : sent_) {
    if (!filter.accepts(sent.name)) continue;
    const std::string expected = sync::to_string(sent.by_layout[layout]);
    const auto it = held.find(sent.name);
    if (it == held.end()) {
      problems.push_back(where + "tensor " + sent.name + ": missing");
    } else if (it->second != expected) {
      problems.push_back(where + "tensor " + sent.name + ": expected digest " + expected +
                         ", engine has " + it->second);
    }
  }
  return problems;
}

std::vector<std::string> SentRecord::check(
    std::span<sync::trainer::EngineApi* const> engines,
    const std::vector<sync::ServerInfoResponse>& infos) const {
  if (empty()) return {"nothing to verify: no update has been committed"};
  std::mutex mu;
  std::vector<std::string> problems;
  unverifiable_.clear();
  const auto failures = sync::trainer::on_all_engines(
      engines, "GET /weights_checksum", [&](sync::trainer::EngineApi& engine, std::size_t i) {
        if (engine.flavor() == sync::trainer::EngineFlavor::kSglang) {
          std::lock_guard lock(mu);
          unverifiable_.push_back(engine.url());
          return;
        }
        for (const auto& runner : infos[i].runners) {
          if (!sync::covers(selector_, runner.name)) continue;
          auto found = check_runner(engine.url(), runner,
                                    engine.weights_checksum(runner.name, /*recompute=*/true));
          std::lock_guard lock(mu);
          problems.insert(problems.end(), found.begin(), found.end());
        }
      });
  for (const auto& f : failures) problems.push_back(sync::trainer::to_string(f));
  return problems;
}

}  // namespace weightcast::python

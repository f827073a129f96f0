#include "sync/trainer/verify.h"

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"

namespace weightcast::sync::trainer {

std::vector<SentDigest> sent_digests(std::span<const NamedTensor> tensors) {
  std::vector<SentDigest> out;
  out.reserve(tensors.size());
  std::vector<std::byte> scratch;
  for (const auto& t : tensors) {
    SentDigest d{t.meta.name, {}};
    // A producer's digest was checked against these bytes by every engine that took them.
    d.by_layout[static_cast<int>(Layout::kNone)] =
        t.digest != nullptr ? *t.digest : tensor_digest(t.bytes);
    scratch.assign(t.bytes.begin(), t.bytes.end());
    apply_layout(Layout::kShuffle, t.meta, scratch);
    d.by_layout[static_cast<int>(Layout::kShuffle)] = tensor_digest(scratch);
    out.push_back(std::move(d));
  }
  return out;
}

std::string to_text(const std::vector<SentDigest>& digests) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& d : digests) {
    list.push_back({d.name, to_string(d.by_layout[0]), to_string(d.by_layout[1])});
  }
  return list.dump();
}

std::vector<SentDigest> parse_sent_digests(std::string_view text) {
  std::vector<SentDigest> out;
  try {
    const nlohmann::json list = nlohmann::json::parse(text);
    for (const auto& item : list.get_ref<const nlohmann::json::array_t&>()) {
      SentDigest d;
      d.name = item.at(0).get<std::string>();
      d.by_layout[0] = parse_digest(item.at(1).get<std::string>(), "sent digest");
      d.by_layout[1] = parse_digest(item.at(2).get<std::string>(), "sent digest");
      out.push_back(std::move(d));
    }
  } catch (const nlohmann::json::exception& e) {
    throw comm::BadRequestError(std::string("sent digests: ") + e.what());
  }
  return out;
}

RunnerMirror::RunnerMirror(const RunnerInfo& info, const ModelSpec& spec, std::uint64_t seed)
    : info_(info),
      layout_(parse_layout(info.layout)),
      filter_(NameFilter::from_globs(info.filters, "runner filters")) {
  const std::vector<TensorMeta> initial =
      info.name == Runner::kTarget ? target_tensors(spec) : draft_tensors(spec);
  // The engine's own initial weights: its seed when it reports one (an engine may be started with
  // another seed than the trainer's; tensors the updates never touch keep its values).
  seed = info.seed.value_or(seed);
  std::vector<std::byte> bytes;
  for (const auto& meta : initial) {
    bytes.resize(meta.byte_count());
    fill_tensor(meta, seed, 0, bytes);
    apply_layout(layout_, meta, bytes);
    expected_[meta.name] = tensor_digest(bytes);
  }
}

void RunnerMirror::apply(Selector selector, const std::vector<SentDigest>& sent) {
  if (!covers(selector, info_.name)) return;
  for (const auto& d : sent) {
    if (filter_.accepts(d.name)) {
      expected_[d.name] = d.by_layout[static_cast<int>(layout_)];
    }
  }
}

std::vector<std::string> RunnerMirror::compare(const WeightsChecksumResponse& checksum) const {
  std::vector<std::string> problems;
  const std::string runner(to_string(info_.name));
  std::map<std::string, const TensorChecksum*> seen;
  for (const auto& t : checksum.tensors) seen[t.name] = &t;
  for (const auto& [name, digest] : expected_) {
    const auto it = seen.find(name);
    if (it == seen.end()) {
      problems.push_back("runner " + runner + " tensor " + name + ": missing on the engine");
    } else if (it->second->digest.size() != 32 ||
               parse_digest(it->second->digest, "digest") != digest) {
      problems.push_back("runner " + runner + " tensor " + name + ": expected digest " +
                         to_string(digest) + ", engine has " + it->second->digest);
    }
  }
  for (const auto& [name, entry] : seen) {
    if (!expected_.contains(name)) {
      problems.push_back("runner " + runner + " tensor " + name + ": not expected on the engine");
    }
  }
  return problems;
}

std::vector<std::string> adapter_problems(std::span<EngineApi* const> engines,
                                          const std::string& name, const std::string& version,
                                          const std::vector<SentDigest>& sent) {
  std::map<std::string, Digest> expected;
  for (const auto& d : sent) expected[d.name] = d.by_layout[static_cast<int>(Layout::kNone)];
  std::vector<std::vector<std::string>> found(engines.size());
  const auto failures = on_all_engines(
      engines, "GET /weights_checksum?lora=" + name, [&](EngineApi& engine, std::size_t i) {
        const auto answer = engine.adapter_checksum(name);
        const std::string where = "engine " + engine.url() + " adapter '" + name + "' ";
        auto& out = found[i];
        if (answer.weight_version != version) {
          out.push_back(where + "version '" + answer.weight_version + "', expected '" + version +
                        "'");
        }
        std::map<std::string, std::string> held;
        for (const auto& t : answer.tensors) held[t.name] = t.digest;
        for (const auto& [tensor, digest] : expected) {
          const auto it = held.find(tensor);
          if (it == held.end()) {
            out.push_back(where + "lacks '" + tensor + "'");
          } else if (it->second != to_string(digest)) {
            out.push_back(where + "'" + tensor + "': digest " + it->second + ", sent " +
                          to_string(digest));
          }
        }
        for (const auto& [tensor, digest] : held) {
          if (!expected.count(tensor)) out.push_back(where + "holds unexpected '" + tensor + "'");
        }
      });
  std::vector<std::string> problems;
  for (const auto& f : failures) problems.push_back(to_string(f));
  for (auto& list : found) problems.insert(problems.end(), list.begin(), list.end());
  return problems;
}

UpdateVerifier::UpdateVerifier(std::span<EngineApi* const> engines,
                               const std::vector<ServerInfoResponse>& infos, const ModelSpec& spec,
                               std::uint64_t seed)
    : engines_(engines) {
  WC_ENFORCE_EQ(engines.size(), infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i) {
    versions_.push_back(infos[i].weight_version);
    auto& runners = mirrors_.emplace_back();
    if (engines[i]->flavor() == EngineFlavor::kSglang || infos[i].runners.empty()) {
      unverifiable_.push_back(engines[i]->url());
      continue;
    }
    for (const auto& runner : infos[i].runners) runners.emplace_back(runner, spec, seed);
  }
}

void UpdateVerifier::apply(Selector selector, const std::vector<SentDigest>& sent) {
  for (auto& runners : mirrors_) {
    for (auto& mirror : runners) mirror.apply(selector, sent);
  }
}

std::vector<UpdateVerifier::Problem> UpdateVerifier::check(const std::string& version) {
  return check_versions(std::vector<std::string>(engines_.size(), version));
}

std::vector<UpdateVerifier::Problem> UpdateVerifier::check_unchanged() {
  return check_versions(versions_);
}

std::vector<UpdateVerifier::Problem> UpdateVerifier::check_adapter(
    const std::string& name, const std::string& version, const std::vector<SentDigest>& sent) {
  std::vector<EngineApi*> checked;
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    if (!mirrors_[i].empty()) checked.push_back(engines_[i]);  // not the unverifiable (SGLang)
  }
  std::vector<Problem> problems;
  for (auto& text : adapter_problems(checked, name, version, sent)) {
    problems.push_back({Runner::kTarget, std::move(text)});
  }
  return problems;
}

std::vector<UpdateVerifier::Problem> UpdateVerifier::check_versions(
    const std::vector<std::string>& versions) {
  std::vector<std::vector<Problem>> found(engines_.size());
  const auto failures =
      on_all_engines(engines_, "GET /weights_checksum", [&](EngineApi& engine, std::size_t i) {
        for (const auto& mirror : mirrors_[i]) {
          // Recomputed from the resident bytes: a stored digest would miss bytes changed after
          // the commit (docs/trainer.md, "Verification").
          const auto answer = engine.weights_checksum(mirror.runner(), /*recompute=*/true);
          const std::string where = "engine " + engine.url() + " ";
          if (answer.weight_version != versions[i]) {
            found[i].push_back({mirror.runner(), where + "runner " +
                                                     std::string(to_string(mirror.runner())) +
                                                     ": weight_version '" + answer.weight_version +
                                                     "', expected '" + versions[i] + "'"});
          }
          for (auto& problem : mirror.compare(answer)) {
            found[i].push_back({mirror.runner(), where + problem});
          }
        }
      });
  std::vector<Problem> problems;
  for (const auto& f : failures) problems.push_back({std::nullopt, to_string(f)});
  for (auto& list : found) problems.insert(problems.end(), list.begin(), list.end());
  return problems;
}

}  // namespace weightcast::sync::trainer

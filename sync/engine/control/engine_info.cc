// Engine routes that only read: health, server_info, weights_checksum, metrics.
#include <charconv>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/engine/control/engine.h"
#include "weightcast/config.h"

namespace weightcast::sync::engine {

namespace {

using Json = nlohmann::json;

// Prometheus label values escape backslash, double quote and newline.
std::string label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The ServerArgs keys of SGLang's /get_server_info that trainers read, with this engine's values:
// one data-parallel replica, no pipeline parallelism, speculative knobs unset.
void add_sglang_keys(Json& j, int tp_size, int ep_size,
                     const std::optional<std::string>& algorithm) {
  j["dp_size"] = 1;
  j["pp_size"] = 1;
  j["ep_size"] = ep_size;
  j["tp_size"] = tp_size;
  for (const char* key :
       {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"}) {
    j[key] = nullptr;
  }
  j["speculative_algorithm"] = algorithm ? Json(*algorithm) : Json(nullptr);
  j["internal_states"] = Json::array({Json::object({{"last_gen_throughput", 0.0}})});
}

}  // namespace

Reply Engine::health() const {
  std::lock_guard lock(mu_);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  j["paused"] = receiver_->paused();
  j["in_session"] = receiver_->in_session();
  j["weight_version"] = runners_->weight_version();
  return {200, j.dump()};
}

Reply Engine::server_info() const {
  std::lock_guard lock(mu_);
  ServerInfoResponse info;
  info.message = "ok";
  info.version = WEIGHTCAST_VERSION;
  for (Runner id : runners_->runners()) {
    const RunnerConfig& config = runners_->config(id);
    info.runners.push_back({id, config.filter.globs(), std::string(to_string(config.layout)),
                            runners_->tensor_count(id), config.seed});
  }
  info.selectors.assign(kAllSelectors.begin(), kAllSelectors.end());
  for (const auto& name : comm::available_backends()) info.backends.push_back(parse_backend(name));
  info.rank_count = opts_.rank_count;
  info.tp_size = opts_.rank_count;
  info.weight_version = runners_->weight_version();
  info.speculative_algorithm = opts_.speculative_algorithm;
  info.session_selector = receiver_->session_selector();

  // The schema's fields first (what trainers parse), then ours for people and tests.
  Json j = Json::parse(to_json_string(info));
  Json selectors = Json::array();
  for (Selector s : kAllSelectors) selectors.push_back(to_string(s));
  j["selectors_supported"] = selectors;
  for (std::size_t i = 0; i < info.runners.size(); ++i) {
    const RunnerConfig& config = runners_->config(info.runners[i].name);
    Json& r = j["runners"][i];
    r["filter"] = config.filter.text();
    r["model"] = config.model;
    if (!config.seed) r["seed"] = nullptr;  // weights from a file; the schema omits it
    r["source"] = config.source;
    r["tensors"] = info.runners[i].tensor_count;
  }
  j["paused"] = receiver_->paused();
  j["in_session"] = receiver_->in_session();
  j["legacy_finalize"] = opts_.legacy_finalize;
  const auto now = std::chrono::steady_clock::now();
  j["lease"] = lease_.alive(now)
                   ? Json{{"holder", lease_.holder()}, {"seconds_left", lease_.seconds_left(now)}}
                   : Json(nullptr);
  Json frozen = Json::array();
  for (Runner r : opts_.sessionless.frozen) frozen.push_back(to_string(r));
  j["frozen_runners"] = frozen;
  Json groups = Json::array();
  for (const auto& [name, group] : receiver_->joined()) {
    groups.push_back({{"group_name", name},
                      {"backend", to_string(group->spec().backend)},
                      {"rank_offset", group->spec().rank_offset},
                      {"world_size", group->spec().world_size},
                      {"ranks", group->rank_count()},
                      {"aborted", group->aborted()},
                      {"abort_reason", group->abort_reason()},
                      {"buckets_received", group->buckets_received()},
                      {"bytes_received", group->bytes_received()},
                      {"data_path", group->data_path()}});
  }
  j["groups"] = groups;
  add_sglang_keys(j, opts_.rank_count, opts_.experts.ep_size, opts_.speculative_algorithm);
  // Which routed experts each engine rank holds (its EP rank's), as SGLang's loaders keep them.
  Json placements = Json::array();
  for (const auto& placement : receiver_->expert_placements()) {
    placements.push_back(placement.describe());
  }
  j["expert_placement"] = placements;
  return {200, j.dump()};
}

Reply Engine::weight_version_info() const {
  std::lock_guard lock(mu_);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  j["weight_version"] = runners_->weight_version();
  return {200, j.dump()};
}

Reply Engine::model_info() const {
  std::lock_guard lock(mu_);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  const Runner main =
      runners_->has(Runner::kTarget) ? Runner::kTarget : runners_->runners().front();
  // SGLang's types: model_path and tokenizer_path are path strings; preferred_sampling_params
  // an optional string. The model spec itself is in /server_info.
  const RunnerConfig& config = runners_->config(main);
  std::string path = config.source;
  if (path == "generated" && config.seed) path += ":seed=" + std::to_string(*config.seed);
  j["model_path"] = path;
  j["tokenizer_path"] = path;
  j["is_generation"] = true;
  j["preferred_sampling_params"] = nullptr;
  j["weight_version"] = runners_->weight_version();
  return {200, j.dump()};
}

Reply Engine::weights_checksum(const std::string& runner_text, bool recompute) const {
  Runner id;
  try {
    id = parse_runner(runner_text);
  } catch (const comm::BadRequestError& e) {
    return error_reply(400, std::string("runner: ") + e.what());
  }
  if (!runners_->has(id)) {
    return error_reply(400, "runner: this engine holds no '" + runner_text + "' runner");
  }
  const RunnerChecksum sum = runners_->checksum(id, recompute);
  WeightsChecksumResponse response;
  response.message = "ok";
  response.runner = id;
  response.weight_version = sum.weight_version;
  response.digest = to_string(sum.combined);
  response.tensors.reserve(sum.tensors.size());
  for (std::size_t i = 0; i < sum.tensors.size(); ++i) {
    TensorChecksum tc;
    tc.name = sum.tensors[i].name;
    tc.digest = to_string(sum.tensors[i].digest);
    tc.dtype = sum.metas[i].dtype;
    tc.shape = sum.metas[i].shape;
    response.tensors.push_back(std::move(tc));
  }
  Json j = Json::parse(to_json_string(response));
  j["layout"] = to_string(sum.layout);
  j["ranks_agree"] = sum.ranks_agree;
  Json ranks = Json::array();
  for (const auto& d : sum.rank_staged) ranks.push_back(to_string(d));
  j["rank_staged_digests"] = ranks;
  j["digest_age_seconds"] = sum.digest_age_s;
  j["recomputed"] = recompute;
  return {200, j.dump()};
}

Reply Engine::metrics() const {
  std::ostringstream os;
  std::lock_guard lock(mu_);
  counters_.write(os, receiver_->bytes_received());
  const std::string version = runners_->weight_version();
  metric_header(os, "weightcast_engine_weight_version_info", "gauge",
                "The committed weight_version, as a label.");
  os << "weightcast_engine_weight_version_info{weight_version=\"" << label_value(version)
     << "\"} 1\n";
  std::int64_t numeric = 0;
  auto [end, ec] = std::from_chars(version.data(), version.data() + version.size(), numeric);
  if (ec == std::errc() && end == version.data() + version.size()) {
    metric_header(os, "weightcast_engine_weight_version", "gauge",
                  "The committed weight_version when it is an integer.");
    os << "weightcast_engine_weight_version " << numeric << '\n';
  }
  metric_header(os, "weightcast_engine_runner_digest_age_seconds", "gauge",
                "Seconds since a runner's weights (and digests) last changed.");
  for (Runner id : runners_->runners()) {
    os << "weightcast_engine_runner_digest_age_seconds{runner=\"" << to_string(id) << "\"} "
       << runners_->digest_age_seconds(id) << '\n';
  }
  metric_header(os, "weightcast_engine_session_open", "gauge",
                "1 while an update session is open.");
  os << "weightcast_engine_session_open " << (receiver_->in_session() ? 1 : 0) << '\n';
  metric_header(os, "weightcast_engine_paused", "gauge", "1 while generation is paused.");
  os << "weightcast_engine_paused " << (receiver_->paused() ? 1 : 0) << '\n';
  if (const auto accept = probe_cache_.last()) {
    metric_header(os, "weightcast_engine_spec_accept_length", "gauge",
                  "Speculative accept length at the last probe (GET /spec_accept_length).");
    os << "weightcast_engine_spec_accept_length " << *accept << '\n';
  }
  const BlockPoolStats pool = runners_->block_pool()->stats();
  metric_header(os, "weightcast_engine_pool_allocations_total", "counter",
                "Receive-pool arenas mapped from the system (flat once updates reuse them).");
  os << "weightcast_engine_pool_allocations_total " << pool.allocations << '\n';
  metric_header(os, "weightcast_engine_pool_reuses_total", "counter",
                "Bucket receive buffers served from pooled memory.");
  os << "weightcast_engine_pool_reuses_total " << pool.reuses << '\n';
  metric_header(os, "weightcast_engine_pool_bytes", "gauge",
                "Receive-pool bytes: in use by weights and staging, or free for reuse.");
  os << "weightcast_engine_pool_bytes{state=\"allocated\"} " << pool.allocated_bytes << '\n';
  os << "weightcast_engine_pool_bytes{state=\"free\"} " << pool.free_bytes << '\n';
  metric_header(os, "weightcast_engine_groups", "gauge", "Joined weight update groups.");
  os << "weightcast_engine_groups " << receiver_->joined().size() << '\n';
  metric_header(os, "weightcast_engine_group_data_path", "gauge",
                "1 per joined group, labelled with how its broadcasts reach this engine: "
                "single-copy, chain, gloo-tree or nccl.");
  for (const auto& [name, group] : receiver_->joined()) {
    os << "weightcast_engine_group_data_path{group=\"" << label_value(name) << "\",path=\""
       << label_value(group->data_path()) << "\"} 1\n";
  }
  return {200, os.str(), "text/plain; version=0.0.4"};
}

}  // namespace weightcast::sync::engine

#include "sync/engine/control/engine_readers.h"

#include <charconv>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/model/layout.h"
#include "sync/model/spec_probe.h"
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

constexpr const char* kEmbed = "model.embed_tokens.weight";

constexpr const char* kLmHead = "lm_head.weight";

constexpr const char* kDraftFc = "draft.fc.weight";

// The logical bytes of a resident tensor: its runner's layout undone when it was applied, as a
// kernel reading it through that layout would see them.
bool read_logical(const RunnerSet& runners, Runner id, const std::string& name, TensorMeta& meta,
                  std::vector<std::byte>& out) {
  const Layout layout = runners.config(id).layout;
  return runners.with_tensor(id, name, [&](const ResidentTensor& t) {
    meta = t.meta;
    out = t.bytes.to_vector();
    if (t.laid_out) undo_layout(layout, t.meta, out);
  });
}

}  // namespace

Reply EngineReaders::health() const {
  std::lock_guard lock(ctx_.mu);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  j["paused"] = ctx_.receiver.paused();
  j["in_session"] = ctx_.receiver.in_session();
  j["weight_version"] = ctx_.runners.weight_version();
  return {200, j.dump()};
}

Reply EngineReaders::server_info() const {
  std::lock_guard lock(ctx_.mu);
  ServerInfoResponse info;
  info.message = "ok";
  info.version = WEIGHTCAST_VERSION;
  for (Runner id : ctx_.runners.runners()) {
    const RunnerConfig& config = ctx_.runners.config(id);
    info.runners.push_back({id, config.filter.globs(), std::string(to_string(config.layout)),
                            ctx_.runners.tensor_count(id), config.seed});
  }
  info.selectors.assign(kAllSelectors.begin(), kAllSelectors.end());
  for (const auto& name : comm::available_backends()) info.backends.push_back(parse_backend(name));
  info.rank_count = ctx_.opts.rank_count;
  info.tp_size = ctx_.opts.rank_count;
  info.weight_version = ctx_.runners.weight_version();
  info.speculative_algorithm = ctx_.opts.speculative_algorithm;
  info.session_selector = ctx_.receiver.session_selector();
  if (ctx_.opts.colocate && !ctx_.host_identity.empty()) info.colocate_host = ctx_.host_identity;
  info.lora = true;  // the list itself follows below
  for (const ShardPlan& plan : ctx_.opts.shard_plans)
    info.shard_plans.push_back(to_json(plan).dump());

  // The schema's fields first (what trainers parse), then ours for people and tests.
  Json j = Json::parse(to_json_string(info));
  Json selectors = Json::array();
  for (Selector s : kAllSelectors) selectors.push_back(to_string(s));
  j["selectors_supported"] = selectors;
  for (std::size_t i = 0; i < info.runners.size(); ++i) {
    const RunnerConfig& config = ctx_.runners.config(info.runners[i].name);
    Json& r = j["runners"][i];
    r["filter"] = config.filter.text();
    r["model"] = config.model;
    if (!config.seed) r["seed"] = nullptr;  // weights from a file; the schema omits it
    r["source"] = config.source;
    r["tensors"] = info.runners[i].tensor_count;
  }
  j["paused"] = ctx_.receiver.paused();
  j["in_session"] = ctx_.receiver.in_session();
  j["legacy_finalize"] = ctx_.opts.legacy_finalize;
  const auto now = std::chrono::steady_clock::now();
  j["lease"] = ctx_.lease.alive(now) ? Json{{"holder", ctx_.lease.holder()},
                                            {"seconds_left", ctx_.lease.seconds_left(now)}}
                                     : Json(nullptr);
  Json frozen = Json::array();
  for (Runner r : ctx_.opts.sessionless.frozen) frozen.push_back(to_string(r));
  j["frozen_runners"] = frozen;
  Json groups = Json::array();
  for (const auto& [name, group] : ctx_.receiver.joined()) {
    groups.push_back({{"group_name", name},
                      {"backend", to_string(group->spec().backend)},
                      {"rank_offset", group->spec().rank_offset},
                      {"world_size", group->spec().world_size},
                      {"ranks", group->rank_count()},
                      {"engine_ranks", group->spec().ranks},  // empty: every rank
                      {"aborted", group->aborted()},
                      {"abort_reason", group->abort_reason()},
                      {"buckets_received", group->buckets_received()},
                      {"bytes_received", group->bytes_received()},
                      {"data_path", group->data_path()}});
  }
  j["groups"] = groups;
  Json adapters = Json::array();
  for (const auto& a : ctx_.receiver.adapters().held()) {
    adapters.push_back({{"lora_name", a->name},
                        {"config", Json::parse(to_json_string(a->config))},
                        {"version", a->version},
                        {"tensors", a->tensors.size()},
                        {"bytes", a->byte_count()},
                        {"digest", to_string(a->combined_digest())}});
  }
  j["lora_adapters"] = adapters;
  add_sglang_keys(j, ctx_.opts.rank_count, ctx_.opts.experts.ep_size,
                  ctx_.opts.speculative_algorithm);
  // Which routed experts each engine rank holds (its EP rank's), as SGLang's loaders keep them.
  Json placements = Json::array();
  for (const auto& placement : ctx_.receiver.expert_placements()) {
    placements.push_back(placement.describe());
  }
  j["expert_placement"] = placements;
  return {200, j.dump()};
}

Reply EngineReaders::weight_version_info() const {
  std::lock_guard lock(ctx_.mu);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  j["weight_version"] = ctx_.runners.weight_version();
  return {200, j.dump()};
}

Reply EngineReaders::model_info() const {
  std::lock_guard lock(ctx_.mu);
  Json j = Json::parse(to_json_string(BasicResponse{true, "ok"}));
  const Runner main =
      ctx_.runners.has(Runner::kTarget) ? Runner::kTarget : ctx_.runners.runners().front();
  // SGLang's types: model_path and tokenizer_path are path strings; preferred_sampling_params
  // an optional string. The model spec itself is in /server_info.
  const RunnerConfig& config = ctx_.runners.config(main);
  std::string path = config.source;
  if (path == "generated" && config.seed) path += ":seed=" + std::to_string(*config.seed);
  j["model_path"] = path;
  j["tokenizer_path"] = path;
  j["is_generation"] = true;
  j["preferred_sampling_params"] = nullptr;
  j["weight_version"] = ctx_.runners.weight_version();
  return {200, j.dump()};
}

Reply EngineReaders::weights_checksum(const std::string& runner_text, bool recompute) const {
  Runner id;
  try {
    id = parse_runner(runner_text);
  } catch (const comm::BadRequestError& e) {
    return error_reply(400, std::string("runner: ") + e.what());
  }
  if (!ctx_.runners.has(id)) {
    return error_reply(400, "runner: this engine holds no '" + runner_text + "' runner");
  }
  const RunnerChecksum sum = ctx_.runners.checksum(id, recompute);
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

Reply EngineReaders::metrics() const {
  std::ostringstream os;
  std::lock_guard lock(ctx_.mu);
  ctx_.counters.write(os, ctx_.receiver.bytes_received());
  const std::string version = ctx_.runners.weight_version();
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
  for (Runner id : ctx_.runners.runners()) {
    os << "weightcast_engine_runner_digest_age_seconds{runner=\"" << to_string(id) << "\"} "
       << ctx_.runners.digest_age_seconds(id) << '\n';
  }
  metric_header(os, "weightcast_engine_session_open", "gauge",
                "1 while an update session is open.");
  os << "weightcast_engine_session_open " << (ctx_.receiver.in_session() ? 1 : 0) << '\n';
  metric_header(os, "weightcast_engine_paused", "gauge", "1 while generation is paused.");
  os << "weightcast_engine_paused " << (ctx_.receiver.paused() ? 1 : 0) << '\n';
  if (const auto accept = ctx_.probe_cache.last()) {
    metric_header(os, "weightcast_engine_spec_accept_length", "gauge",
                  "Speculative accept length at the last probe (GET /spec_accept_length).");
    os << "weightcast_engine_spec_accept_length " << *accept << '\n';
  }
  const BlockPoolStats pool = ctx_.runners.block_pool()->stats();
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
  os << "weightcast_engine_groups " << ctx_.receiver.joined().size() << '\n';
  metric_header(os, "weightcast_engine_group_data_path", "gauge",
                "1 per joined group, labelled with how its broadcasts reach this engine: "
                "single-copy, chain, gloo-tree or nccl.");
  for (const auto& [name, group] : ctx_.receiver.joined()) {
    os << "weightcast_engine_group_data_path{group=\"" << label_value(name) << "\",path=\""
       << label_value(group->data_path()) << "\"} 1\n";
  }
  return {200, os.str(), "text/plain; version=0.0.4"};
}

Reply EngineReaders::spec_accept_length() const {
  if (!ctx_.runners.has(Runner::kDraft) || !ctx_.runners.has(Runner::kTarget)) {
    return error_reply(409, "spec_accept_length: needs a target and a draft runner");
  }
  // Digests and version identify the weights the probe would read; reuse the last answer.
  const RunnerChecksum target = ctx_.runners.checksum(Runner::kTarget);
  const RunnerChecksum draft = ctx_.runners.checksum(Runner::kDraft);
  const std::string key =
      target.weight_version + "/" + to_string(target.combined) + "/" + to_string(draft.combined);
  const auto probed = ctx_.probe_cache.get(key, [&]() -> std::variant<Reply, double> {
    TensorMeta embed_meta, head_meta, fc_meta;
    std::vector<std::byte> embed, head, fc;
    if (!read_logical(ctx_.runners, Runner::kTarget, kEmbed, embed_meta, embed) ||
        !read_logical(ctx_.runners, Runner::kDraft, kDraftFc, fc_meta, fc)) {
      return error_reply(409, std::string("spec_accept_length: needs ") + kEmbed +
                                  " in the target and an EAGLE-style " + kDraftFc +
                                  " in the draft");
    }
    if (!read_logical(ctx_.runners, Runner::kTarget, kLmHead, head_meta, head)) {
      head = embed;  // tied embeddings
      head_meta = embed_meta;
    }
    if (embed_meta.shape.size() != 2 || head_meta.shape != embed_meta.shape ||
        fc_meta.shape != std::vector<std::int64_t>{embed_meta.shape[1], 2 * embed_meta.shape[1]} ||
        fc_meta.dtype != embed_meta.dtype) {
      return error_reply(409,
                         "spec_accept_length: embedding, lm_head and draft fc shapes "
                         "or dtypes do not fit together");
    }
    SpecProbeInput in{embed_meta.dtype, embed_meta.shape[0], embed_meta.shape[1], embed, head, fc};
    return run_spec_probe(in).accept_length;
  });
  if (const auto* refusal = std::get_if<Reply>(&probed)) return *refusal;
  SpecAcceptLengthResponse response;
  response.message = "ok";
  response.accept_length = std::get<double>(probed);
  response.draft_tokens = SpecProbeOptions{}.draft_tokens;
  response.weight_version = target.weight_version;
  return {200, to_json_string(response)};
}

Reply EngineReaders::weights_checker(const WeightsCheckerRequest& request) {
  ctx_.touch();
  return checker_.handle(ctx_.runners, request);
}

Reply EngineReaders::lora_checksum(const std::string& name) const {
  const auto adapter = ctx_.receiver.adapters().find(name);
  if (!adapter) return error_reply(404, "lora: no adapter '" + name + "' is loaded");
  return {200, adapter_checksum_json(*adapter)};
}

}  // namespace weightcast::sync::engine

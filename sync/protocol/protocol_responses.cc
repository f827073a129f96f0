#include "sync/protocol/protocol_responses.h"

#include <climits>
#include <limits>

#include "comm/errors.h"
#include "sync/protocol/protocol_json.h"
#include "sync/protocol/protocol_text.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync {
namespace {

using wire::Json;

using wire::fail;
using wire::indexed;

// {success, message}, shared by every response. message is optional on the wire: SGLang's
// outputs default it to "".
template <typename T>
void read_common(const wire::FieldReader& r, T& out) {
  out.success = r.boolean("success");
  if (const Json* v = r.find("message")) out.message = wire::as_string(*v, r.path("message"));
}

Json common_json(bool success, const std::string& message) {
  return {{"success", success}, {"message", message}};
}

Runner read_runner(const Json& value, const std::string& path) {
  return wire::as_enum(value, path, parse_runner);
}

std::string read_digest(const Json& value, const std::string& path) {
  std::string s = wire::as_string(value, path);
  if (s.empty() || s.size() > kMaxDigestHexLength) {
    fail(path, "must be 1 to " + std::to_string(kMaxDigestHexLength) + " hex digits (got " +
                   std::to_string(s.size()) + " bytes)");
  }
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      fail(path, "must be lower-case hex (got " + quoted(s) + ")");
    }
  }
  return s;
}

std::vector<std::int64_t> read_checked_shape(const Json& value, const std::string& path) {
  std::vector<std::int64_t> shape = wire::read_shape(value, path);
  (void)checked_numel(shape, path);
  return shape;
}

RunnerUpdateStats read_runner_stats(const Json& value, const std::string& path) {
  const wire::FieldReader r = wire::as_object(value, path);
  RunnerUpdateStats out;
  out.runner = read_runner(r.required("runner"), r.path("runner"));
  out.tensors_loaded = wire::as_uint(r.required("tensors_loaded"), r.path("tensors_loaded"));
  out.tensors_transformed =
      wire::as_uint(r.required("tensors_transformed"), r.path("tensors_transformed"));
  return out;
}

}  // namespace

RunnerInfo read_runner_info(const Json& value, const std::string& path,
                            const ProtocolLimits& limits) {
  const wire::FieldReader r = wire::as_object(value, path);
  RunnerInfo out;
  out.name = read_runner(r.required("name"), r.path("name"));
  const Json& filters =
      wire::as_array(r.required("filters"), r.path("filters"), limits.max_list_entries);
  out.filters.reserve(filters.size());
  for (std::size_t i = 0; i < filters.size(); ++i) {
    out.filters.push_back(
        wire::as_text(filters[i], indexed(r.path("filters"), i), limits.max_name_length));
  }
  out.layout =
      wire::as_identifier(r.required("layout"), r.path("layout"), limits.max_string_length);
  out.tensor_count = wire::as_uint(r.required("tensor_count"), r.path("tensor_count"));
  if (const Json* seed = r.optional("seed")) out.seed = wire::as_uint(*seed, r.path("seed"));
  return out;
}

namespace {

TensorChecksum read_tensor_checksum(const Json& value, const std::string& path,
                                    const ProtocolLimits& limits) {
  const wire::FieldReader r = wire::as_object(value, path);
  TensorChecksum out;
  out.name = wire::as_identifier(r.required("name"), r.path("name"), limits.max_name_length);
  out.digest = read_digest(r.required("digest"), r.path("digest"));
  const std::string dtype_path = r.path("dtype");
  const Json& dtype = r.required("dtype");
  out.dtype = wire::as_enum(dtype, dtype_path, parse_dtype);
  out.shape = read_checked_shape(r.required("shape"), r.path("shape"));
  return out;
}

// Reads a list of objects with `read(entry, path)`, requiring a unique key per entry.
template <typename T, typename Read, typename Key>
std::vector<T> read_unique_list(const wire::FieldReader& r, std::string_view field,
                                const ProtocolLimits& limits, Read read, Key key) {
  const std::string path = r.path(field);
  const Json& list = wire::as_array(r.required(field), path, limits.max_list_entries);
  std::vector<T> out;
  out.reserve(list.size());
  wire::UniqueNames unique(path);
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.push_back(read(list[i], indexed(path, i)));
    unique.add(key(out.back()), i);
  }
  return out;
}

}  // namespace

BasicResponse parse_basic_response(std::string_view body, const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  BasicResponse out;
  read_common(wire::FieldReader(j, ""), out);
  return out;
}

BeginWeightUpdateResponse parse_begin_weight_update_response(std::string_view body,
                                                             const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  BeginWeightUpdateResponse out;
  read_common(r, out);
  const Json& v = r.required("selector");
  out.selector = wire::as_enum(v, "selector", parse_selector);
  for (auto [key, field] :
       {std::pair{"session_id", &out.session_id}, std::pair{"holder", &out.holder},
        std::pair{"weight_version", &out.weight_version},
        std::pair{"runner_digest", &out.runner_digest}, std::pair{"lease_id", &out.lease_id},
        std::pair{"lora_version", &out.lora_version}, std::pair{"lora_digest", &out.lora_digest}}) {
    if (const Json* f = r.optional(key)) *field = wire::as_text(*f, key, limits.max_string_length);
  }
  if (const Json* f = r.optional("lease_ttl_s")) out.lease_ttl_s = wire::as_uint(*f, "lease_ttl_s");
  return out;
}

SpecAcceptLengthResponse parse_spec_accept_length_response(std::string_view body,
                                                           const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  SpecAcceptLengthResponse out;
  read_common(r, out);
  out.draft_tokens = wire::as_int(r.required("draft_tokens"), "draft_tokens", 1, 1024);
  const Json& v = r.required("accept_length");
  if (!v.is_number() || v.get<double>() < 1.0 ||
      v.get<double>() > static_cast<double>(out.draft_tokens + 1)) {
    throw comm::BadRequestError("accept_length: must be a number in [1, draft_tokens + 1]");
  }
  out.accept_length = v.get<double>();
  out.weight_version =
      wire::as_text(r.required("weight_version"), "weight_version", limits.max_string_length);
  return out;
}

EndWeightUpdateResponse parse_end_weight_update_response(std::string_view body,
                                                         const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  EndWeightUpdateResponse out;
  read_common(r, out);
  out.weight_version =
      wire::as_text(r.required("weight_version"), "weight_version", limits.max_string_length);
  out.runners = read_unique_list<RunnerUpdateStats>(
      r, "runners", limits, read_runner_stats,
      [](const RunnerUpdateStats& s) { return to_string(s.runner); });
  for (auto [key, field] : {std::pair{"runner_digest", &out.runner_digest},
                            std::pair{"lora_digest", &out.lora_digest}}) {
    if (const Json* f = r.optional(key)) *field = wire::as_text(*f, key, limits.max_string_length);
  }
  return out;
}

ServerInfoResponse parse_server_info_response(std::string_view body, const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  ServerInfoResponse out;
  read_common(r, out);
  out.version = wire::as_text(r.required("version"), "version", limits.max_string_length);
  out.runners = read_unique_list<RunnerInfo>(
      r, "runners", limits,
      [&](const Json& v, const std::string& p) { return read_runner_info(v, p, limits); },
      [](const RunnerInfo& i) { return to_string(i.name); });
  out.selectors = read_unique_list<Selector>(
      r, "selectors", limits,
      [](const Json& v, const std::string& p) { return wire::as_enum(v, p, parse_selector); },
      [](Selector s) { return to_string(s); });
  out.backends = read_unique_list<Backend>(
      r, "backends", limits,
      [](const Json& v, const std::string& p) { return wire::as_enum(v, p, parse_backend); },
      [](Backend b) { return to_string(b); });
  out.rank_count =
      static_cast<int>(wire::as_int(r.required("rank_count"), "rank_count", 1, INT_MAX));
  out.tp_size = static_cast<int>(wire::as_int(r.required("tp_size"), "tp_size", 1, INT_MAX));
  out.weight_version =
      wire::as_text(r.required("weight_version"), "weight_version", limits.max_string_length);
  if (const Json* v = r.optional("speculative_algorithm")) {
    out.speculative_algorithm =
        wire::as_text(*v, "speculative_algorithm", limits.max_string_length);
  }
  if (const Json* v = r.optional("session_selector")) {
    out.session_selector = wire::as_enum(*v, "session_selector", parse_selector);
  }
  if (const Json* v = r.optional("colocate_host")) {
    out.colocate_host = wire::as_text(*v, "colocate_host", limits.max_string_length);
  }
  if (const Json* v = r.optional("lora_adapters")) {
    if (!v->is_array()) throw comm::BadRequestError("lora_adapters: must be a list");
    out.lora = true;
  }
  if (const Json* v = r.optional("shard_plans")) {
    if (!v->is_array()) throw comm::BadRequestError("shard_plans: must be a list");
    if (v->size() != static_cast<std::size_t>(out.rank_count)) {
      throw comm::BadRequestError("shard_plans: " + std::to_string(v->size()) +
                                  " plans for rank_count " + std::to_string(out.rank_count) +
                                  " (one per engine rank)");
    }
    for (std::size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_object()) {
        throw comm::BadRequestError("shard_plans[" + std::to_string(i) + "]: must be an object");
      }
      out.shard_plans.push_back((*v)[i].dump());
    }
  }
  return out;
}

WeightsChecksumResponse parse_weights_checksum_response(std::string_view body,
                                                        const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  WeightsChecksumResponse out;
  read_common(r, out);
  out.runner = read_runner(r.required("runner"), "runner");
  out.weight_version =
      wire::as_text(r.required("weight_version"), "weight_version", limits.max_string_length);
  out.digest = read_digest(r.required("digest"), "digest");
  out.tensors = read_unique_list<TensorChecksum>(
      r, "tensors", limits,
      [&](const Json& v, const std::string& p) { return read_tensor_checksum(v, p, limits); },
      [](const TensorChecksum& t) { return t.name; });
  return out;
}

std::string to_json_string(const BasicResponse& response) {
  return wire::dump(common_json(response.success, response.message));
}

std::string to_json_string(const BeginWeightUpdateResponse& response) {
  Json j = common_json(response.success, response.message);
  j["selector"] = to_string(response.selector);
  if (!response.session_id.empty()) j["session_id"] = response.session_id;
  if (!response.holder.empty()) j["holder"] = response.holder;
  if (!response.weight_version.empty()) j["weight_version"] = response.weight_version;
  if (!response.runner_digest.empty()) j["runner_digest"] = response.runner_digest;
  if (!response.lease_id.empty()) {
    j["lease_id"] = response.lease_id;
    j["lease_ttl_s"] = response.lease_ttl_s;
  }
  if (!response.lora_version.empty()) j["lora_version"] = response.lora_version;
  if (!response.lora_digest.empty()) j["lora_digest"] = response.lora_digest;
  return wire::dump(j);
}

std::string to_json_string(const SpecAcceptLengthResponse& response) {
  Json j = common_json(response.success, response.message);
  j["accept_length"] = response.accept_length;
  j["draft_tokens"] = response.draft_tokens;
  j["weight_version"] = response.weight_version;
  return wire::dump(j);
}

std::string to_json_string(const EndWeightUpdateResponse& response) {
  Json j = common_json(response.success, response.message);
  j["weight_version"] = response.weight_version;
  Json runners = Json::array();
  for (const RunnerUpdateStats& s : response.runners) {
    runners.push_back({{"runner", to_string(s.runner)},
                       {"tensors_loaded", s.tensors_loaded},
                       {"tensors_transformed", s.tensors_transformed}});
  }
  j["runners"] = std::move(runners);
  if (!response.runner_digest.empty()) j["runner_digest"] = response.runner_digest;
  if (!response.lora_digest.empty()) j["lora_digest"] = response.lora_digest;
  return wire::dump(j);
}

std::string to_json_string(const ServerInfoResponse& response) {
  Json j = common_json(response.success, response.message);
  j["version"] = response.version;
  Json runners = Json::array();
  for (const RunnerInfo& i : response.runners) {
    runners.push_back({{"name", to_string(i.name)},
                       {"filters", i.filters},
                       {"layout", i.layout},
                       {"tensor_count", i.tensor_count}});
    if (i.seed) runners.back()["seed"] = *i.seed;
  }
  j["runners"] = std::move(runners);
  Json selectors = Json::array();
  for (Selector s : response.selectors) selectors.push_back(to_string(s));
  j["selectors"] = std::move(selectors);
  Json backends = Json::array();
  for (Backend b : response.backends) backends.push_back(to_string(b));
  j["backends"] = std::move(backends);
  j["rank_count"] = response.rank_count;
  j["tp_size"] = response.tp_size;
  j["weight_version"] = response.weight_version;
  // null rather than absent, as SGLang's server_info reports an unset speculative algorithm.
  j["speculative_algorithm"] =
      response.speculative_algorithm ? Json(*response.speculative_algorithm) : Json(nullptr);
  j["session_selector"] =
      response.session_selector ? Json(to_string(*response.session_selector)) : Json(nullptr);
  if (response.colocate_host) j["colocate_host"] = *response.colocate_host;
  if (response.lora) j["lora_adapters"] = Json::array();
  if (!response.shard_plans.empty()) {
    Json plans = Json::array();
    for (const std::string& text : response.shard_plans) plans.push_back(Json::parse(text));
    j["shard_plans"] = std::move(plans);
  }
  return wire::dump(j);
}

std::string to_json_string(const WeightsChecksumResponse& response) {
  Json j = common_json(response.success, response.message);
  j["runner"] = to_string(response.runner);
  j["weight_version"] = response.weight_version;
  j["digest"] = response.digest;
  Json tensors = Json::array();
  for (const TensorChecksum& t : response.tensors) {
    tensors.push_back({{"name", t.name},
                       {"digest", t.digest},
                       {"dtype", to_string(t.dtype)},
                       {"shape", t.shape}});
  }
  j["tensors"] = std::move(tensors);
  return wire::dump(j);
}

}  // namespace weightcast::sync

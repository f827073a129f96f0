#include "sync/protocol/protocol.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "comm/errors.h"
#include "sync/protocol/protocol_fields.h"
#include "sync/protocol/protocol_json.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {

namespace wire {

std::string read_group_name(const FieldReader& r, const ProtocolLimits& limits) {
  const Json* v = r.find("group_name");
  if (v == nullptr) return std::string(kDefaultGroupName);
  return as_identifier(*v, "group_name", limits.max_name_length);
}

Selector read_selector(const FieldReader& r) {
  return as_enum(r.required("selector"), "selector", parse_selector);
}

std::optional<std::string> read_session_text(const FieldReader& r, std::string_view key,
                                             const ProtocolLimits& limits) {
  const Json* v = r.optional(key);
  if (v == nullptr) return std::nullopt;
  return as_text(*v, r.path(key), limits.max_string_length);
}

}  // namespace wire

using wire::fail;
using wire::Json;

std::size_t UpdateWeightsFromDistributedRequest::total_bytes() const {
  std::size_t total = 0;
  for (const TensorMeta& t : tensors) {
    const std::size_t bytes = t.byte_count();
    if (bytes > std::numeric_limits<std::size_t>::max() - total) {
      throw comm::BadRequestError("bucket byte count overflows size_t at tensor " + quoted(t.name));
    }
    total += bytes;
  }
  return total;
}

InitWeightsUpdateGroupRequest parse_init_weights_update_group(std::string_view body,
                                                              const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  InitWeightsUpdateGroupRequest out;
  out.master_address =
      wire::as_identifier(r.required("master_address"), "master_address", kMaxAddressLength);
  out.master_port =
      static_cast<int>(wire::as_int(r.required("master_port"), "master_port", 1, 65535));
  out.world_size =
      static_cast<int>(wire::as_int(r.required("world_size"), "world_size", 1, INT_MAX));
  out.rank_offset =
      static_cast<int>(wire::as_int(r.required("rank_offset"), "rank_offset", 1, INT_MAX));
  if (out.rank_offset >= out.world_size) {
    fail("rank_offset", "must be in [1, world_size) = [1, " + std::to_string(out.world_size) +
                            ") (got " + std::to_string(out.rank_offset) + ")");
  }
  out.group_name = wire::read_group_name(r, limits);
  if (const Json* v = r.find("backend")) {
    out.backend = wire::as_enum(*v, "backend", parse_backend);
  }
  if (const Json* v = r.optional("rendezvous")) {
    out.rendezvous = wire::as_enum(*v, "rendezvous", parse_rendezvous);
  }
  if (const Json* v = r.optional("ranks")) {
    if (!v->is_array() || v->empty()) fail("ranks", "must be a non-empty list of engine ranks");
    for (std::size_t i = 0; i < v->size(); ++i) {
      const wire::Path field("ranks", i);
      out.ranks.push_back(static_cast<int>(wire::as_int((*v)[i], field, 0, INT_MAX)));
      if (i > 0 && out.ranks[i] <= out.ranks[i - 1]) {
        fail(field, "must be above the rank before it (ranks ascend)");
      }
    }
    if (out.ranks.size() > static_cast<std::size_t>(out.world_size - out.rank_offset)) {
      fail("ranks", std::to_string(out.ranks.size()) + " ranks from rank_offset " +
                        std::to_string(out.rank_offset) + " exceed world_size " +
                        std::to_string(out.world_size));
    }
  }
  return out;
}

DestroyWeightsUpdateGroupRequest parse_destroy_weights_update_group(std::string_view body,
                                                                    const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  const wire::FieldReader r(j, "");
  return {wire::read_group_name(r, limits)};
}

PauseGenerationRequest parse_pause_generation(std::string_view body, const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  const wire::FieldReader r(j, "");
  PauseGenerationRequest out;
  if (const Json* v = r.find("mode")) {
    out.mode = wire::as_enum(*v, "mode", parse_pause_mode);
  }
  return out;
}

ContinueGenerationRequest parse_continue_generation(std::string_view body,
                                                    const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  const wire::FieldReader r(j, "");
  return {r.boolean_or("torch_empty_cache", true)};
}

FlushCacheRequest parse_flush_cache(std::string_view body, const ProtocolLimits& limits) {
  (void)wire::parse_body(body, limits, /*allow_empty=*/true);
  return {};
}

BeginWeightUpdateRequest parse_begin_weight_update(std::string_view body,
                                                   const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  BeginWeightUpdateRequest out{wire::read_selector(r)};
  out.holder = wire::read_session_text(r, "holder", limits);
  out.lease_id = wire::read_session_text(r, "lease_id", limits);
  if (const Json* v = r.optional("lease_ttl_s")) {
    out.lease_ttl_s = static_cast<std::uint64_t>(wire::as_int(*v, "lease_ttl_s", 1, 86400));
  }
  if (const Json* v = r.optional("lora")) {
    if (!v->is_object())
      throw comm::BadRequestError("lora: must be an object {lora_name, config, op}");
    const wire::FieldReader l(*v, "lora.");
    LoraBegin lora;
    lora.name = wire::as_text(l.required("lora_name"), "lora.lora_name", limits.max_string_length);
    const Json& config = l.required("config");
    if (!config.is_object()) throw comm::BadRequestError("lora.config: must be an object (PEFT's)");
    lora.config_json = config.dump();
    if (const Json* op = l.optional("op")) {
      const std::string text = wire::as_text(*op, "lora.op", 16);
      if (text != "load" && text != "upsert") {
        throw comm::BadRequestError("lora.op: '" + text + "' is not \"load\" or \"upsert\"");
      }
      lora.upsert = text == "upsert";
    }
    out.lora = std::move(lora);
  }
  return out;
}

UnloadLoraAdapterRequest parse_unload_lora_adapter(std::string_view body,
                                                   const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  return {wire::as_text(r.required("lora_name"), "lora_name", limits.max_string_length)};
}

UpdateWeightVersionRequest parse_update_weight_version(std::string_view body,
                                                       const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  UpdateWeightVersionRequest out;
  out.new_version =
      wire::as_text(r.required("new_version"), "new_version", limits.max_string_length);
  out.abort_all_requests = r.boolean_or("abort_all_requests", true);
  out.session_id = wire::read_session_text(r, "session_id", limits);
  return out;
}

EndWeightUpdateRequest parse_end_weight_update(std::string_view body,
                                               const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  return {wire::read_session_text(wire::FieldReader(j, ""), "session_id", limits)};
}

AbortWeightUpdateRequest parse_abort_weight_update(std::string_view body,
                                                   const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  const wire::FieldReader r(j, "");
  AbortWeightUpdateRequest out;
  out.session_id = wire::read_session_text(r, "session_id", limits);
  out.force = r.boolean_or("force", false);
  return out;
}

ReleaseLeaseRequest parse_release_lease(std::string_view body, const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits, /*allow_empty=*/true);
  const wire::FieldReader r(j, "");
  ReleaseLeaseRequest out;
  out.lease_id = wire::read_session_text(r, "lease_id", limits);
  out.force = r.boolean_or("force", false);
  return out;
}

WeightsCheckerRequest parse_weights_checker(std::string_view body, const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  return {wire::as_text(r.required("action"), "action", limits.max_string_length)};
}

std::string to_json_string(const InitWeightsUpdateGroupRequest& request) {
  Json j = {{"master_address", request.master_address}, {"master_port", request.master_port},
            {"rank_offset", request.rank_offset},       {"world_size", request.world_size},
            {"group_name", request.group_name},         {"backend", to_string(request.backend)}};
  if (request.rendezvous) j["rendezvous"] = to_string(*request.rendezvous);
  if (!request.ranks.empty()) j["ranks"] = request.ranks;
  return wire::dump(j);
}

std::string to_json_string(const DestroyWeightsUpdateGroupRequest& request) {
  return wire::dump({{"group_name", request.group_name}});
}

std::string to_json_string(const PauseGenerationRequest& request) {
  return wire::dump({{"mode", to_string(request.mode)}});
}

std::string to_json_string(const ContinueGenerationRequest& request) {
  return wire::dump({{"torch_empty_cache", request.torch_empty_cache}});
}

std::string to_json_string(const FlushCacheRequest& /*request*/) {
  return wire::dump(Json::object());
}

std::string to_json_string(const BeginWeightUpdateRequest& request) {
  Json j = {{"selector", to_string(request.selector)}};
  if (request.holder) j["holder"] = *request.holder;
  if (request.lease_id) j["lease_id"] = *request.lease_id;
  if (request.lease_ttl_s) j["lease_ttl_s"] = *request.lease_ttl_s;
  if (request.lora) {
    j["lora"] = {{"lora_name", request.lora->name},
                 {"config", Json::parse(request.lora->config_json)},
                 {"op", request.lora->upsert ? "upsert" : "load"}};
  }
  return wire::dump(j);
}

namespace {

// Appends `text` as a JSON string, exactly as wire::dump writes it: printable ASCII as it is,
// anything else (escapes, UTF-8, bytes that are not UTF-8) through nlohmann itself.
void append_string(std::string& out, std::string_view text) {
  const bool plain = std::all_of(text.begin(), text.end(), [](char c) {
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  });
  if (!plain) {
    out += wire::dump(Json(std::string(text)));
    return;
  }
  out += '"';
  out += text;
  out += '"';
}

void append_key(std::string& out, std::string_view key) {
  out += out.size() > 1 ? ",\"" : "\"";
  out += key;
  out += "\":";
}

template <typename List, typename Append>
void append_list(std::string& out, const List& list, Append append) {
  out += '[';
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (i > 0) out += ',';
    append(list[i]);
  }
  out += ']';
}

void append_strings(std::string& out, const std::vector<std::string>& list) {
  append_list(out, list, [&out](const std::string& s) { append_string(out, s); });
}

}  // namespace

// Written directly rather than through a DOM and wire::dump: a bucket of experts lists thousands
// of tensors, and building the DOM cost 0.46 us per tensor on the trainer, per engine. The text is
// the one wire::dump gives for the same object, byte for byte: keys in sorted order (nlohmann's
// objects are std::maps), no spaces, optional fields omitted rather than null, as slime/Miles
// send them (tests/sync/protocol/request_test.cc holds the two side by side).
std::string to_json_string(const UpdateWeightsFromDistributedRequest& request) {
  const auto& tensors = request.tensors;
  std::string out;
  out.reserve(256 + tensors.size() * 128);
  out += '{';
  append_key(out, "abort_all_requests");
  out += request.abort_all_requests ? "true" : "false";
  if (request.delta) {
    const BucketDelta& d = *request.delta;
    append_key(out, "delta");
    out += "{\"base_digests\":";
    append_strings(out, d.base_digests);
    out += ",\"base_version\":";
    append_string(out, d.base_version);
    out += ",\"codec\":";
    append_string(out, to_string(d.codec));
    out += ",\"wire_bytes\":";
    out += std::to_string(d.wire_bytes);
    out += '}';
  }
  if (!request.digests.empty()) {
    append_key(out, "digests");
    append_strings(out, request.digests);
  }
  append_key(out, "dtypes");
  append_list(out, tensors,
              [&out](const TensorMeta& t) { append_string(out, to_string(t.dtype)); });
  append_key(out, "flush_cache");
  out += request.flush_cache ? "true" : "false";
  append_key(out, "group_name");
  append_string(out, request.group_name);
  if (request.load_format != LoadFormat::kPerTensor) {
    append_key(out, "load_format");
    append_string(out, to_string(request.load_format));
  }
  append_key(out, "names");
  append_list(out, tensors, [&out](const TensorMeta& t) { append_string(out, t.name); });
  if (request.selector) {
    append_key(out, "selector");
    append_string(out, to_string(*request.selector));
  }
  if (request.sequence) {
    append_key(out, "sequence");
    out += std::to_string(*request.sequence);
  }
  if (request.session_id) {
    append_key(out, "session_id");
    append_string(out, *request.session_id);
  }
  append_key(out, "shapes");
  append_list(out, tensors, [&out](const TensorMeta& t) {
    append_list(out, t.shape, [&out](std::int64_t dim) { out += std::to_string(dim); });
  });
  append_key(out, "torch_empty_cache");
  out += request.torch_empty_cache ? "true" : "false";
  if (request.weight_version) {
    append_key(out, "weight_version");
    append_string(out, *request.weight_version);
  }
  out += '}';
  return out;
}

std::string to_json_string(const UpdateWeightVersionRequest& request) {
  Json j = {{"new_version", request.new_version},
            {"abort_all_requests", request.abort_all_requests}};
  if (request.session_id) j["session_id"] = *request.session_id;
  return wire::dump(j);
}

std::string to_json_string(const EndWeightUpdateRequest& request) {
  Json j = Json::object();
  if (request.session_id) j["session_id"] = *request.session_id;
  return wire::dump(j);
}

std::string to_json_string(const AbortWeightUpdateRequest& request) {
  Json j = Json::object();
  if (request.session_id) j["session_id"] = *request.session_id;
  if (request.force) j["force"] = true;
  return wire::dump(j);
}

std::string to_json_string(const ReleaseLeaseRequest& request) {
  Json j = Json::object();
  if (request.lease_id) j["lease_id"] = *request.lease_id;
  if (request.force) j["force"] = true;
  return wire::dump(j);
}

std::string to_json_string(const WeightsCheckerRequest& request) {
  return wire::dump({{"action", request.action}});
}

}  // namespace weightcast::sync

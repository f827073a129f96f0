#include "sync/protocol/tensor_update.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "comm/colocate/cuda_ipc.h"
#include "comm/errors.h"

namespace weightcast::sync {
namespace {

using Json = nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw comm::BadRequestError(what);
}

const Json& field(const Json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(path + key + ": required");
  return *it;
}

std::uint64_t uint_of(const Json& v, const std::string& path) {
  if (!v.is_number_unsigned()) bad(path + ": must be a non-negative integer");
  return v.get<std::uint64_t>();
}

std::string text_of(const Json& v, const std::string& path, std::size_t max) {
  if (!v.is_string()) bad(path + ": must be a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > max) bad(path + ": must be 1 to " + std::to_string(max) + " bytes");
  return s;
}

std::optional<std::string> optional_text(const Json& j, const char* key, std::size_t max) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return text_of(*it, key, max);
}

bool boolean_or(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_boolean()) bad(std::string(key) + ": must be true or false");
  return it->get<bool>();
}

void read_manifest(const Json& list, const ProtocolLimits& limits,
                   UpdateWeightsFromTensorRequest& out) {
  if (!list.is_array() || list.empty()) bad("manifest: must be a non-empty list");
  if (list.size() > limits.max_names_per_bucket) bad("manifest: too many tensors");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = "manifest[" + std::to_string(i) + "].";
    const Json& e = list[i];
    if (!e.is_object()) bad("manifest[" + std::to_string(i) + "]: must be an object");
    TensorMeta meta;
    meta.name = text_of(field(e, "name", path), path + "name", limits.max_name_length);
    meta.dtype = parse_dtype(text_of(field(e, "dtype", path), path + "dtype", 64));
    const Json& shape = field(e, "shape", path);
    if (!shape.is_array()) bad(path + "shape: must be a list");
    for (const Json& d : shape) {
      if (!d.is_number_integer()) bad(path + "shape: dimensions must be integers");
      meta.shape.push_back(d.get<std::int64_t>());
    }
    validate(meta, limits.max_name_length);
    out.offsets.push_back(uint_of(field(e, "offset", path), path + "offset"));
    out.tensors.push_back(std::move(meta));
  }
}

// Every tensor inside the segment, none overlapping another, names unique.
void check_layout(const UpdateWeightsFromTensorRequest& r) {
  std::vector<std::size_t> order(r.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return r.offsets[a] < r.offsets[b]; });
  std::uint64_t end_of_previous = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    const std::uint64_t bytes = r.tensors[i].byte_count();
    const std::string path = "manifest[" + std::to_string(i) + "] ('" + r.tensors[i].name + "')";
    if (r.offsets[i] > r.segment.size || bytes > r.segment.size - r.offsets[i]) {
      bad(path + ": bytes " + std::to_string(r.offsets[i]) + ".." +
          std::to_string(r.offsets[i] + bytes) + " lie outside the segment of " +
          std::to_string(r.segment.size) + " bytes");
    }
    if (k > 0 && r.offsets[i] < end_of_previous) {
      bad(path + ": overlaps '" + r.tensors[order[k - 1]].name + "'");
    }
    end_of_previous = r.offsets[i] + bytes;
  }
  std::vector<std::string> names;
  for (const auto& t : r.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  if (auto it = std::adjacent_find(names.begin(), names.end()); it != names.end()) {
    bad("manifest: '" + *it + "' appears twice");
  }
}

void read_session_fields(const Json& j, const ProtocolLimits& limits,
                         UpdateWeightsFromTensorRequest& out) {
  if (auto s = optional_text(j, "selector", 16)) out.selector = parse_selector(*s);
  out.session_id = optional_text(j, "session_id", limits.max_string_length);
  out.weight_version = optional_text(j, "weight_version", limits.max_string_length);
  out.flush_cache = boolean_or(j, "flush_cache", true);
  out.abort_all_requests = boolean_or(j, "abort_all_requests", false);
}

}  // namespace

UpdateWeightsFromTensorRequest parse_update_weights_from_tensor(std::string_view body,
                                                                const ProtocolLimits& limits) {
  if (body.size() > limits.max_body_bytes) bad("body: larger than the engine's limit");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) bad("body: must be a JSON object");
  if (j.contains("serialized_named_tensors")) {
    bad("serialized_named_tensors: torch-pickled tensors are not read by weightcast-engine "
        "(unpickling runs code); send load_format \"weightcast_segment\" with a manifest and a "
        "segment handle (docs/colocated.md)");
  }
  const std::string format = text_of(field(j, "load_format", ""), "load_format", 64);
  if (format != kSegmentLoadFormat) {
    bad("load_format: '" + format + "' cannot be read by weightcast-engine; it reads \"" +
        std::string(kSegmentLoadFormat) + "\"");
  }
  UpdateWeightsFromTensorRequest out;
  const Json& segment = field(j, "segment", "");
  if (!segment.is_object()) bad("segment: must be an object {socket or cuda_ipc, size}");
  if (segment.contains("socket") == segment.contains("cuda_ipc")) {
    bad("segment: must name exactly one of socket (a memfd segment) and cuda_ipc (a device "
        "segment)");
  }
  if (segment.contains("socket")) {
    out.segment.socket = text_of(segment["socket"], "segment.socket", 107);
  } else {
    const std::string hex = text_of(segment["cuda_ipc"], "segment.cuda_ipc", 256);
    out.segment.cuda_ipc =
        comm::colocate::CudaIpcHandle::from_hex(hex, "segment.cuda_ipc").to_hex();
  }
  out.segment.size = uint_of(field(segment, "size", "segment."), "segment.size");
  if (out.segment.size == 0 || out.segment.size > limits.max_bucket_bytes) {
    bad("segment.size: must be 1 to " + std::to_string(limits.max_bucket_bytes) + " bytes");
  }
  read_manifest(field(j, "manifest", ""), limits, out);
  const Json& digests = field(j, "digests", "");
  if (!digests.is_array() || digests.size() != out.tensors.size()) {
    bad("digests: must list one digest per manifest entry (" + std::to_string(out.tensors.size()) +
        ")");
  }
  for (std::size_t i = 0; i < digests.size(); ++i) {
    out.digests.push_back(text_of(digests[i], "digests[" + std::to_string(i) + "]", 64));
  }
  check_layout(out);
  read_session_fields(j, limits, out);
  return out;
}

UpdateWeightsFromTensorRequest parse_local_bucket(std::string_view body, std::uint64_t size,
                                                  const ProtocolLimits& limits) {
  if (body.size() > limits.max_body_bytes) bad("body: larger than the engine's limit");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) bad("body: must be a JSON object");
  if (size == 0 || size > limits.max_bucket_bytes) {
    bad("bucket: must be 1 to " + std::to_string(limits.max_bucket_bytes) + " bytes (got " +
        std::to_string(size) + ")");
  }
  UpdateWeightsFromTensorRequest out;
  out.segment.size = size;
  read_manifest(field(j, "manifest", ""), limits, out);
  check_layout(out);
  read_session_fields(j, limits, out);
  return out;
}

std::string to_json_string(const UpdateWeightsFromTensorRequest& request) {
  WC_ENFORCE_EQ(request.tensors.size(), request.offsets.size(), "manifest offsets");
  WC_ENFORCE_EQ(request.tensors.size(), request.digests.size(), "manifest digests");
  Json manifest = Json::array();
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorMeta& t = request.tensors[i];
    manifest.push_back({{"name", t.name},
                        {"dtype", std::string(to_string(t.dtype))},
                        {"shape", t.shape},
                        {"offset", request.offsets[i]}});
  }
  Json j{{"load_format", std::string(kSegmentLoadFormat)},
         {"segment",
          {{request.segment.cuda_ipc.empty() ? "socket" : "cuda_ipc",
            request.segment.cuda_ipc.empty() ? request.segment.socket : request.segment.cuda_ipc},
           {"size", request.segment.size}}},
         {"manifest", std::move(manifest)},
         {"digests", request.digests},
         {"flush_cache", request.flush_cache},
         {"abort_all_requests", request.abort_all_requests}};
  if (request.selector) j["selector"] = std::string(to_string(*request.selector));
  if (request.session_id) j["session_id"] = *request.session_id;
  if (request.weight_version) j["weight_version"] = *request.weight_version;
  return j.dump();
}

}  // namespace weightcast::sync

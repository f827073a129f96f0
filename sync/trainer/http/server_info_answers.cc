#include "sync/trainer/http/server_info_answers.h"

#include "comm/errors.h"
#include "sync/protocol/protocol_json.h"
#include "sync/protocol/protocol_responses.h"

namespace weightcast::sync::trainer {

namespace {

using wire::Json;

Json object_of(std::string_view body, const ProtocolLimits& limits) {
  try {
    return wire::parse_body(body, limits);
  } catch (const comm::BadRequestError& e) {
    throw comm::BadRequestError(std::string("/server_info: ") + e.what());
  }
}

ReceiverAnnounce read_announce(const Json& value, const std::string& path,
                               const ProtocolLimits& limits) {
  const wire::FieldReader r = wire::as_object(value, path + ".");
  ReceiverAnnounce out;
  out.version = wire::as_text(r.required("version"), r.path("version"), limits.max_string_length);
  if (const Json* v = r.optional("receiver")) {
    out.receiver = wire::as_text(*v, r.path("receiver"), limits.max_string_length);
  }
  out.native_routes = r.boolean_or("native_routes", false);
  if (const Json* v = r.optional("runners")) {
    const Json& list = wire::as_array(*v, r.path("runners"), limits.max_list_entries);
    for (std::size_t i = 0; i < list.size(); ++i) {
      out.runners.push_back(read_runner_info(list[i], wire::indexed(r.path("runners"), i), limits));
    }
  }
  if (const Json* v = r.optional("routes")) {
    const Json& list = wire::as_array(*v, r.path("routes"), limits.max_list_entries);
    for (std::size_t i = 0; i < list.size(); ++i) {
      out.routes.push_back(
          wire::as_text(list[i], wire::indexed(r.path("routes"), i), limits.max_string_length));
    }
  }
  return out;
}

}  // namespace

EngineFlavor flavor_of_server_info(std::string_view body) {
  const Json j = object_of(body, ProtocolLimits{});
  if (j.contains("vllm_config")) return EngineFlavor::kVllm;
  if (j.contains("success")) return EngineFlavor::kWeightcast;
  const auto announce = read_receiver_announce(body, ProtocolLimits{});
  if (announce && announce->native_routes) return EngineFlavor::kWeightcast;
  return EngineFlavor::kSglang;
}

std::optional<ReceiverAnnounce> read_receiver_announce(std::string_view body,
                                                       const ProtocolLimits& limits) {
  const Json j = object_of(body, limits);
  if (auto it = j.find("weightcast"); it != j.end() && !it->is_null()) {
    return read_announce(*it, "weightcast", limits);
  }
  // SGLang: the plug-in's hook adds the key to each scheduler's internal state.
  if (auto states = j.find("internal_states"); states != j.end() && states->is_array()) {
    for (std::size_t i = 0; i < states->size(); ++i) {
      const Json& state = (*states)[i];
      if (!state.is_object()) continue;
      if (auto it = state.find("weightcast"); it != state.end() && !it->is_null()) {
        return read_announce(*it, wire::indexed("internal_states", i) + ".weightcast", limits);
      }
    }
  }
  return std::nullopt;
}

}  // namespace weightcast::sync::trainer

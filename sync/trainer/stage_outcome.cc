#include "sync/trainer/stage_outcome.h"

#include "comm/errors.h"

namespace weightcast::sync::trainer {

using nlohmann::json;

json stage_outcome_json(const StageOutcome& o) {
  const auto& r = o.result;
  json failures = json::array();
  for (const auto& f : r.failures) {
    failures.push_back({{"engine", f.engine},
                        {"route", f.route},
                        {"message", f.message},
                        {"unreachable", f.unreachable},
                        {"timed_out", f.timed_out}});
  }
  return {{"sent", o.sent},
          {"error", o.error},
          {"ok", r.ok},
          {"tensors", r.tensors},
          {"bytes", r.bytes},
          {"buckets", r.buckets},
          {"wire_bytes", r.wire_bytes},
          {"delta_buckets", r.delta_buckets},
          {"seconds", r.seconds},
          {"http_wait", r.http_wait_seconds},
          {"pack_wait", r.pack_wait_seconds},
          {"broadcast", r.broadcast_seconds},
          {"hash_wait", r.hash_wait_seconds},
          {"send_error", r.error},
          {"data_path", r.data_path},
          {"failures", failures},
          {"digests", to_text(o.digests)}};
}

StageOutcome stage_outcome_from_json(const json& j) {
  StageOutcome o;
  o.sent = j.at("sent").get<bool>();
  o.error = j.at("error").get<std::string>();
  auto& r = o.result;
  r.ok = j.at("ok").get<bool>();
  r.tensors = j.at("tensors").get<std::uint64_t>();
  r.bytes = j.at("bytes").get<std::uint64_t>();
  r.buckets = j.at("buckets").get<std::uint64_t>();
  r.wire_bytes = j.at("wire_bytes").get<std::uint64_t>();
  r.delta_buckets = j.at("delta_buckets").get<std::uint64_t>();
  r.seconds = j.at("seconds").get<double>();
  r.http_wait_seconds = j.at("http_wait").get<double>();
  r.pack_wait_seconds = j.at("pack_wait").get<double>();
  r.broadcast_seconds = j.at("broadcast").get<double>();
  r.hash_wait_seconds = j.value("hash_wait", 0.0);
  r.error = j.at("send_error").get<std::string>();
  r.data_path = j.at("data_path").get<std::string>();
  for (const auto& f : j.at("failures")) {
    r.failures.push_back({f.at("engine").get<std::string>(), f.at("route").get<std::string>(),
                          f.at("message").get<std::string>(), f.at("unreachable").get<bool>(),
                          f.at("timed_out").get<bool>()});
  }
  o.digests = parse_sent_digests(j.at("digests").get<std::string>());
  return o;
}

std::string to_text(const StageOutcome& o) {
  return stage_outcome_json(o).dump(-1, ' ', false, json::error_handler_t::replace);
}

StageOutcome parse_stage_outcome(std::string_view text) {
  try {
    return stage_outcome_from_json(json::parse(text));
  } catch (const json::exception& e) {
    throw comm::BadRequestError(std::string("stage outcome: ") + e.what());
  }
}

}  // namespace weightcast::sync::trainer

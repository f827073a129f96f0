#include "sync/trainer/http/sglang_answers.h"

#include <nlohmann/json.hpp>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

namespace {

using Json = nlohmann::json;

constexpr std::size_t kMaxMessage = 512;

std::optional<Json> object_of(std::string_view body) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::optional<std::string> text_of(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return std::to_string(it->get<std::int64_t>());
  return std::nullopt;
}

}  // namespace

BasicResponse read_sglang_answer(std::string_view body) {
  // Success is the HTTP status alone, as Miles judges it (raise_for_status): SGLang answers every
  // failed weight route with 400, so a 2xx is success whatever its body says.
  BasicResponse out;
  if (auto j = object_of(body)) {
    out.message = text_of(*j, "message").value_or("");
  } else {
    out.message = std::string(body.substr(0, kMaxMessage));
    while (!out.message.empty() && (out.message.back() == '\n' || out.message.back() == ' ')) {
      out.message.pop_back();
    }
  }
  return out;
}

ServerInfoResponse read_sglang_server_info(std::string_view body, const ProtocolLimits& limits) {
  if (body.size() > limits.max_body_bytes) {
    throw comm::BadRequestError("/get_server_info: answer over the body limit");
  }
  auto j = object_of(body);
  if (!j) throw comm::BadRequestError("/get_server_info: answer is not a JSON object");
  ServerInfoResponse info;
  info.message = "sglang";
  auto tp = j->find("tp_size");
  if (tp != j->end()) {
    if (!tp->is_number_integer() || tp->get<std::int64_t>() < 1 ||
        tp->get<std::int64_t>() > 1 << 20) {
      throw comm::BadRequestError("/get_server_info: tp_size must be a positive integer");
    }
    info.tp_size = static_cast<int>(tp->get<std::int64_t>());
  }
  info.rank_count = info.tp_size;
  info.selectors.assign(kAllSelectors.begin(), kAllSelectors.end());
  info.backends.assign(kAllBackends.begin(), kAllBackends.end());
  info.weight_version = text_of(*j, "weight_version").value_or("");
  info.speculative_algorithm = text_of(*j, "speculative_algorithm");
  info.version = text_of(*j, "version").value_or("");
  return info;
}

std::optional<std::string> read_sglang_weight_version(std::string_view body) {
  auto j = object_of(body);
  if (!j) return std::nullopt;
  return text_of(*j, "weight_version");
}

}  // namespace weightcast::sync::trainer

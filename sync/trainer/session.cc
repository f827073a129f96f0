#include "sync/trainer/session.h"

#include "comm/errors.h"
#include "sync/protocol_text.h"

namespace weightcast::sync::trainer {

UpdateWeightsFromDistributedRequest UpdateSession::bucket_request(const BucketPlan& plan,
                                                                  const std::string& group_name,
                                                                  LoadFormat format) const {
  UpdateWeightsFromDistributedRequest request;
  request.tensors.reserve(plan.entries.size());
  for (const auto& entry : plan.entries) request.tensors.push_back(entry.meta);
  request.group_name = group_name;
  request.selector = selector_;
  request.load_format = format;
  if (format == LoadFormat::kWeightcastBucket) request.sequence = plan.sequence;
  // The session flushed caches before it began; a per-bucket flush would only repeat it.
  request.flush_cache = false;
  request.weight_version = version_;
  return request;
}

std::optional<std::string> UpdateSession::session_id(std::size_t engine) const {
  if (engine >= session_ids_.size() || session_ids_[engine].empty()) return std::nullopt;
  return session_ids_[engine];
}

UpdateWeightsFromDistributedRequest UpdateSession::for_engine(
    UpdateWeightsFromDistributedRequest request, std::size_t engine) const {
  request.session_id = session_id(engine);
  return request;
}

std::string UpdateSession::token() const {
  std::string ids;
  for (std::size_t e = 0; e < session_ids_.size(); ++e) {
    ids += (e ? "," : "") + (session_ids_[e].empty() ? std::string("-") : session_ids_[e]);
  }
  const std::string head = std::string(to_string(selector_)) + " " + version_;
  return ids.empty() ? head : head + " " + ids;
}

UpdateSession join_session(std::string_view token) {
  const auto space = token.find(' ');
  const auto space2 = space == std::string_view::npos ? space : token.find(' ', space + 1);
  if (space == std::string_view::npos || space + 1 >= token.size() || space + 1 == space2 ||
      (space2 != std::string_view::npos && space2 + 1 >= token.size())) {
    throw comm::BadRequestError("session token " + quoted(token) +
                                ": expected '<selector> <version> [<ids>]'");
  }
  const Selector selector = parse_selector(token.substr(0, space));
  std::string version(token.substr(
      space + 1, space2 == std::string_view::npos ? std::string_view::npos : space2 - space - 1));
  validate_identifier(version, 256, "session token version");
  std::vector<std::string> ids;
  if (space2 == std::string_view::npos) return UpdateSession(selector, std::move(version));
  std::string_view rest = token.substr(space2 + 1);
  while (true) {
    const auto comma = rest.find(',');
    std::string id(rest.substr(0, comma));
    if (id != "-") validate_identifier(id, 256, "session token id");
    ids.push_back(id == "-" ? std::string() : id);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return UpdateSession(selector, std::move(version), std::move(ids));
}

}  // namespace weightcast::sync::trainer

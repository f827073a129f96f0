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

std::string UpdateSession::token() const {
  return std::string(to_string(selector_)) + " " + version_;
}

UpdateSession join_session(std::string_view token) {
  const auto space = token.find(' ');
  if (space == std::string_view::npos || space + 1 >= token.size()) {
    throw comm::BadRequestError("session token " + quoted(token) +
                                ": expected '<selector> <version>'");
  }
  const Selector selector = parse_selector(token.substr(0, space));
  std::string version(token.substr(space + 1));
  validate_identifier(version, 256, "session token version");
  return UpdateSession(selector, std::move(version));
}

}  // namespace weightcast::sync::trainer

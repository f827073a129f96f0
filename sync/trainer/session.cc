#include "sync/trainer/session.h"

#include <charconv>
#include <utility>

#include "comm/errors.h"
#include "sync/model/lora.h"
#include "sync/protocol/protocol_text.h"

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

UpdateWeightsFromTensorRequest UpdateSession::segment_request(const BucketPlan& plan,
                                                              std::vector<std::uint64_t> offsets,
                                                              SegmentHandle segment,
                                                              std::vector<std::string> digests,
                                                              std::size_t engine) const {
  WC_ENFORCE_EQ(offsets.size(), plan.entries.size(), "segment offsets of a bucket");
  UpdateWeightsFromTensorRequest request;
  for (const auto& entry : plan.entries) request.tensors.push_back(entry.meta);
  request.offsets = std::move(offsets);
  request.segment = std::move(segment);
  request.digests = std::move(digests);
  request.selector = selector_;
  request.session_id = session_id(engine);
  request.weight_version = version_;
  request.flush_cache = false;  // as bucket_request(): the session flushed caches at begin
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
  const std::string base = delta_base_ ? " base=" + *delta_base_ : std::string();
  return token_without_base() + base + (adapter_ ? " lora=" + *adapter_ : std::string());
}

std::string UpdateSession::token_without_base() const {
  // With members there is one id per member, "-" where the engine issued none.
  const std::size_t count = members_.empty() ? session_ids_.size() : members_.size();
  std::string ids;
  for (std::size_t e = 0; e < count; ++e) {
    const bool has = e < session_ids_.size() && !session_ids_[e].empty();
    ids += (e ? "," : "") + (has ? session_ids_[e] : std::string("-"));
  }
  const std::string head = std::string(to_string(selector_)) + " " + version_;
  if (members_.empty()) return ids.empty() ? head : head + " " + ids;
  std::string members;
  for (std::size_t m : members_) members += (members.empty() ? "" : ",") + std::to_string(m);
  return head + " " + ids + " m" + std::to_string(epoch_) + ":" + members;
}

namespace {

// "m<epoch>:<i,j,...>" of a token: the session's members.
std::pair<std::uint64_t, std::vector<std::size_t>> parse_members(std::string_view text,
                                                                 std::string_view token) {
  const auto colon = text.find(':');
  const auto bad = [&] {
    return comm::BadRequestError("session token " + quoted(token) +
                                 ": expected 'm<epoch>:<members>' after the ids");
  };
  if (text.size() < 3 || text[0] != 'm' || colon == std::string_view::npos) throw bad();
  const auto number = [&](std::string_view digits) {
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) throw bad();
    return value;
  };
  const std::uint64_t epoch = number(text.substr(1, colon - 1));
  std::vector<std::size_t> members;
  std::string_view rest = text.substr(colon + 1);
  while (true) {
    const auto comma = rest.find(',');
    members.push_back(static_cast<std::size_t>(number(rest.substr(0, comma))));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return {epoch, std::move(members)};
}

}  // namespace

// The token's head: everything but its " base=" part.
UpdateSession join_session_without_base(std::string_view token);

UpdateSession join_session(std::string_view token) {
  std::optional<std::string> adapter;
  if (const auto at = token.rfind(" lora="); at != std::string_view::npos) {
    adapter = std::string(token.substr(at + 6));
    validate_adapter_name(*adapter, "session token lora name");
    token = token.substr(0, at);
  }
  std::optional<std::string> base;
  if (const auto at = token.rfind(" base="); at != std::string_view::npos) {
    base = std::string(token.substr(at + 6));
    validate_identifier(*base, 256, "session token base version");
    token = token.substr(0, at);
  }
  UpdateSession session = join_session_without_base(token);
  session.delta_base_ = std::move(base);
  session.adapter_ = std::move(adapter);
  return session;
}

UpdateSession join_session_without_base(std::string_view token) {
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
  std::string_view members_text;
  if (const auto space3 = rest.find(' '); space3 != std::string_view::npos) {
    members_text = rest.substr(space3 + 1);
    rest = rest.substr(0, space3);
  }
  while (true) {
    const auto comma = rest.find(',');
    std::string id(rest.substr(0, comma));
    if (id != "-") validate_identifier(id, 256, "session token id");
    ids.push_back(id == "-" ? std::string() : id);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  UpdateSession session(selector, std::move(version), std::move(ids));
  if (members_text.empty()) return session;
  auto [epoch, members] = parse_members(members_text, token);
  if (members.size() != session.session_ids_.size()) {
    throw comm::BadRequestError("session token " + quoted(token) + ": " +
                                std::to_string(session.session_ids_.size()) + " ids for " +
                                std::to_string(members.size()) + " members");
  }
  return std::move(session).with_members(std::move(members), epoch);
}

}  // namespace weightcast::sync::trainer

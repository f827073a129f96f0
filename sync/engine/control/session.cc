#include "sync/engine/control/session.h"

#include <string>

#include "sync/engine/control/secret.h"

namespace weightcast::sync::engine {
std::optional<Refusal> SessionMachine::begin(Selector selector, std::optional<std::string> holder,
                                             bool sessionless) {
  if (selector_) {
    return Refusal{409, "begin_weight_update: engine busy: a session with selector '" +
                            std::string(to_string(*selector_)) + "' is already open, held by " +
                            holder_text() + "; end or abort it first"};
  }
  selector_ = selector;
  ++session_id_;
  token_ = random_hex(16);
  holder_ = std::move(holder);
  sessionless_ = sessionless;
  pending_version_.reset();
  flush_requested_ = false;
  return std::nullopt;
}

std::optional<Refusal> SessionMachine::check_open(const std::optional<std::string>& token,
                                                  std::string_view route) const {
  if (selector_) return std::nullopt;
  if (token) {
    return Refusal{409, std::string(route) + ": session_id '" + *token +
                            "' is not open (ended, aborted or timed out)"};
  }
  return Refusal{409, std::string(route) + ": no session is open; call begin_weight_update first"};
}

std::optional<Refusal> SessionMachine::check_payload(Selector selector) const {
  if (auto refusal = check_open(std::nullopt, "update_weights_from_distributed")) return refusal;
  if (*selector_ != selector) {
    return Refusal{409, "selector: payload selector '" + std::string(to_string(selector)) +
                            "' differs from the session's '" + std::string(to_string(*selector_)) +
                            "'"};
  }
  return std::nullopt;
}

std::optional<Refusal> SessionMachine::check_end() const {
  if (!selector_) {
    return Refusal{409, "end_weight_update: no session is open (end without begin)"};
  }
  return std::nullopt;
}

std::optional<Refusal> SessionMachine::check_owner(const std::optional<std::string>& token,
                                                   std::string_view route) const {
  if (!selector_) return std::nullopt;
  if (token) {
    if (constant_time_equal(*token, token_)) return std::nullopt;
    return Refusal{409, std::string(route) + ": session_id '" + *token +
                            "' is not the open session, which is held by " + holder_text()};
  }
  if (!holder_ && !sessionless_) return std::nullopt;
  return Refusal{409, std::string(route) + ": the open session is held by " + holder_text() +
                          (sessionless_ ? "; retry once it has been applied"
                                        : "; only calls carrying its session_id may act on it")};
}

std::string SessionMachine::holder_text() const {
  if (sessionless_) return "a sessionless update in progress";
  return holder_ ? "'" + *holder_ + "'" : std::string("an unnamed client");
}

bool SessionMachine::close() {
  const bool was_open = selector_.has_value();
  selector_.reset();
  holder_.reset();
  sessionless_ = false;
  token_.clear();
  pending_version_.reset();
  flush_requested_ = false;
  return was_open;
}

bool SessionMachine::set_version(std::string version) {
  if (selector_) {
    pending_version_ = std::move(version);
    return false;
  }
  return true;
}

}  // namespace weightcast::sync::engine

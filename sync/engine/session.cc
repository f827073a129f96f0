#include "sync/engine/session.h"

#include <string>

namespace weightcast::sync::engine {

std::optional<Refusal> SessionMachine::begin(Selector selector) {
  if (selector_) {
    return Refusal{409, "begin_weight_update: a session with selector '" +
                            std::string(to_string(*selector_)) +
                            "' is already open; end or abort it first"};
  }
  selector_ = selector;
  ++session_id_;
  pending_version_.reset();
  flush_requested_ = false;
  return std::nullopt;
}

std::optional<Refusal> SessionMachine::check_payload(Selector selector) const {
  if (!selector_) {
    return Refusal{409,
                   "update_weights_from_distributed: no session is open; call "
                   "begin_weight_update first"};
  }
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

bool SessionMachine::close() {
  const bool was_open = selector_.has_value();
  selector_.reset();
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

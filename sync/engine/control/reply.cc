#include "sync/engine/control/reply.h"

#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

Reply error_reply(int status, std::string message) {
  return {status, to_json_string(BasicResponse{false, std::move(message)})};
}

Reply refusal_reply(const Refusal& refusal) {
  return error_reply(refusal.status, refusal.message);
}

Reply ok_reply(std::string message) {
  return {200, to_json_string(BasicResponse{true, std::move(message)})};
}

}  // namespace weightcast::sync::engine

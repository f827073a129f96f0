#include "sync/engine/control/reply.h"

#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

Reply error_reply(int status, std::string message) {
  return {status, to_json_string(BasicResponse{false, std::move(message)})};
}

}  // namespace weightcast::sync::engine

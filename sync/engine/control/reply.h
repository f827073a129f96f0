// Reply: what an engine call answers — an HTTP status and a body (JSON unless said otherwise).
//
// The engine's domain code (sync/engine/control/engine.h) returns Replies and never sees HTTP; the
// HTTP layer (sync/engine/http/) turns them into responses. Lifetime/threading: plain values and a
// pure function; safe from any thread.
#pragma once

#include <string>

namespace weightcast::sync::engine {

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// Why a request was refused: the HTTP status and a message naming the rule.
struct Refusal {
  int status = 409;
  std::string message;
};

// {"success": false, "message": message} with `status`.
Reply error_reply(int status, std::string message);
// The refusal as an error reply.
Reply refusal_reply(const Refusal& refusal);
// {"success": true, "message": message} with 200.
Reply ok_reply(std::string message);

}  // namespace weightcast::sync::engine

// The engine's HTTP surface as data: a table of routes (path, methods, auth level, handler),
// independent of the HTTP library, so tests can walk it (every route has an auth level; every
// route refuses a missing token) and call handlers without sockets.
//
// Handlers take a parsed Request and return a Reply (status, JSON body); they never see the
// HTTP library. The server (sync/engine/http/server.h) dispatches: unknown path -> 404, method not
// allowed -> 405, auth -> 401/403, then the handler, always with a JSON body
// {"success": bool, "message": str, ...} (except /metrics, Prometheus text).
// Lifetime: a RouteTable is built once and handed to the server; handlers refer to the Engine,
// which must outlive the server. Threading: the table is immutable once built; handlers are
// called concurrently from the server's worker threads.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sync/engine/control/reply.h"

namespace weightcast::sync::engine {

class Engine;

enum class Method { kGet = 1, kPost = 2 };
std::string_view to_string(Method method);

// Deliberately no zero value: a Route whose auth was left out value-initializes to 0, which
// RouteTable::add() refuses, so a route without an auth level cannot be added.
enum class Auth { kPublic = 1, kToken = 2 };

struct Request {
  Method method = Method::kGet;
  std::string path;
  std::string body;
  std::map<std::string, std::string> query;  // first value of each query parameter
};

using Handler = std::function<Reply(const Request&)>;

struct Route {
  std::string path;
  std::vector<Method> methods;
  Auth auth;
  Handler handler;
};

class RouteTable {
 public:
  // EnforceError on a path that does not start with '/', a path added twice, no methods, an
  // auth level that is not kPublic or kToken, or no handler.
  void add(Route route);
  const Route* find(std::string_view path) const;
  const std::vector<Route>& routes() const { return routes_; }

 private:
  std::vector<Route> routes_;
};

// Every route of the engine (docs/protocol.md), bound to `engine`.
RouteTable engine_routes(Engine& engine);

}  // namespace weightcast::sync::engine

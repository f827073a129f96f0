// HttpServer: serves a RouteTable over HTTP/1.1 (the engine's control plane).
//
// It binds the configured address (loopback by default, never all interfaces unless asked) and
// the given port, 0 meaning an ephemeral one that it keeps for its lifetime, so port() is the
// port it serves. Dispatch happens before any body is read: unknown path -> 404, method not in
// the route -> 405, then, for kToken routes with a token configured, 401/403 (constant-time
// compare). Bodies are capped at max_body_bytes (413); each request's head is capped and must
// arrive, with its body, within read_timeout (sync/engine/http/http_guard.h); a fixed pool of
// worker threads runs handlers. Every error reply is JSON {"success": false, ...}. Lifetime: binds
// in the constructor (comm::ConfigError when it cannot), serves after start() or run(), stops on
// stop() or destruction. Threading: stop() may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/deadline.h"
#include "sync/engine/http/routes.h"

namespace weightcast::sync::engine {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;       // 0: ephemeral
  std::string token;  // empty: no authentication
  std::size_t max_body_bytes = 64u << 20;
  comm::Millis read_timeout{30000};
  comm::Millis write_timeout{30000};
  // An idle keep-alive connection holds a handler thread this long (whole seconds). Clients that
  // reuse connections keep them idle for less (the trainer's: 0.5 s, ConnectionPool).
  comm::Millis keep_alive_timeout{2000};
  // Handler threads. Bucket requests wait in their handler for earlier buckets, so this must
  // exceed the engine's max_buckets_ahead plus the other requests that may arrive meanwhile.
  int threads = 32;
};

class HttpServer {
 public:
  HttpServer(RouteTable routes, ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  const std::string& host() const;
  std::string url() const;  // "http://host:port"

  // Serves on a background thread; returns at once.
  void start();
  // Serves on the calling thread until stop().
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcast::sync::engine

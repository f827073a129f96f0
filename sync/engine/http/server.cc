#include "sync/engine/http/server.h"

#include <httplib.h>

#include <atomic>
#include <thread>

#include "comm/errors.h"
#include "sync/engine/http/auth.h"
#include "sync/engine/http/http_guard.h"

namespace weightcast::sync::engine {

namespace {

std::string reason_phrase(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "not found";
    case 405:
      return "method not allowed";
    case 408:
      return "request timeout";
    case 413:
      return "payload too large: the body exceeds this engine's limit";
    case 414:
      return "URI too long";
    case 416:
      return "range not satisfiable";
    default:
      return status >= 500 ? "internal server error" : "request refused";
  }
}

void send(httplib::Response& res, const Reply& reply) {
  res.status = reply.status;
  res.set_content(reply.body, reply.content_type.c_str());
}

std::optional<Method> method_of(const std::string& text) {
  if (text == "GET") return Method::kGet;
  if (text == "POST") return Method::kPost;
  return std::nullopt;
}

}  // namespace

struct HttpServer::Impl {
  RouteTable routes;
  ServerOptions opts;
  // httplib's server behind the per-connection guard of sync/engine/http/http_guard.h.
  std::unique_ptr<httplib::Server> server = make_guarded_http_server();
  int port = -1;
  std::thread thread;
  // stop() may race with the start of run(): run() marks `entered` before checking `stopped`,
  // stop() marks `stopped` before checking `entered`, so one of them always sees the other.
  std::atomic<bool> stopped{false};
  std::atomic<bool> entered{false};
  std::atomic<bool> done{false};

  // Runs before the body is read, so refused requests never cost a body read. A refused request
  // that carries a body ends its connection (the guard drops it, "Connection: close" tells a
  // keep-alive client): the unread body would be taken for the next request.
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    const auto refused = [&] {
      if (req.has_header("Transfer-Encoding") ||
          (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0")) {
        res.set_header("Connection", "close");
      }
      return httplib::Server::HandlerResponse::Handled;
    };
    const Route* route = routes.find(req.path);
    if (route == nullptr) {
      send(res, error_reply(404, "no route " + req.path));
      return refused();
    }
    const auto method = method_of(req.method);
    const bool allowed = method && std::find(route->methods.begin(), route->methods.end(),
                                             *method) != route->methods.end();
    if (!allowed) {
      std::string allow;
      for (Method m : route->methods) {
        if (!allow.empty()) allow += ", ";
        allow += to_string(m);
      }
      res.set_header("Allow", allow);
      send(res, error_reply(405, "method " + req.method + " not allowed on " + req.path +
                                     " (allowed: " + allow + ")"));
      return refused();
    }
    if (route->auth == Auth::kToken) {
      std::optional<std::string_view> header;
      std::string value;
      if (req.has_header("Authorization")) {
        value = req.get_header_value("Authorization");
        header = value;
      }
      const AuthResult auth = check_bearer(header, opts.token);
      if (auth == AuthResult::kMissing) {
        res.set_header("WWW-Authenticate", "Bearer");
        send(res, error_reply(401, "Authorization: a bearer token is required on " + req.path));
        return refused();
      }
      if (auth == AuthResult::kWrong) {
        send(res, error_reply(403, "Authorization: the bearer token is wrong"));
        return refused();
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  void dispatch(const httplib::Request& req, httplib::Response& res) {
    const Route* route = routes.find(req.path);
    const auto method = method_of(req.method);
    if (route == nullptr || !method) {  // pre_route answered these already
      send(res, error_reply(404, "no route " + req.path));
      return;
    }
    Request request;
    request.method = *method;
    request.path = req.path;
    request.body = req.body;
    for (const auto& [key, value] : req.params) request.query.emplace(key, value);
    try {
      send(res, route->handler(request));
    } catch (const std::exception& e) {
      send(res, error_reply(500, std::string("internal error: ") + e.what()));
    }
  }
};

HttpServer::HttpServer(RouteTable routes, ServerOptions opts) : impl_(std::make_unique<Impl>()) {
  WC_ENFORCE_GT(opts.threads, 0, "server threads");
  WC_ENFORCE_GE(opts.port, 0);
  WC_ENFORCE_LE(opts.port, 65535);
  impl_->routes = std::move(routes);
  impl_->opts = std::move(opts);
  Impl* impl = impl_.get();
  auto& s = *impl->server;
  const auto threads = static_cast<std::size_t>(impl->opts.threads);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(impl->opts.max_body_bytes);
  s.set_read_timeout(impl->opts.read_timeout);
  s.set_write_timeout(impl->opts.write_timeout);
  // Answers go out as soon as they are written: with Nagle's algorithm a keep-alive client's
  // second request waited on the delayed ACK (measured 26 ms per request from Python's
  // http.client against 0.2-0.6 ms on a new connection).
  s.set_tcp_nodelay(true);
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(
      std::max<time_t>(1, static_cast<time_t>(impl->opts.keep_alive_timeout.count() / 1000)));
  s.set_pre_routing_handler([impl](const httplib::Request& req, httplib::Response& res) {
    return impl->pre_route(req, res);
  });
  s.Get(".*",
        [impl](const httplib::Request& req, httplib::Response& res) { impl->dispatch(req, res); });
  s.Post(".*",
         [impl](const httplib::Request& req, httplib::Response& res) { impl->dispatch(req, res); });
  // Errors the library produces itself (413, 400 on a malformed request line) get a JSON body too.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (res.body.empty()) send(res, error_reply(res.status, reason_phrase(res.status)));
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send(res, error_reply(500, "internal error"));
  });

  const auto& host = impl->opts.host;
  if (impl->opts.port == 0) {
    impl->port = s.bind_to_any_port(host);
    if (impl->port <= 0) throw comm::ConfigError("cannot bind an ephemeral port on '" + host + "'");
  } else {
    if (!s.bind_to_port(host, impl->opts.port)) {
      throw comm::ConfigError("cannot bind " + host + ":" + std::to_string(impl->opts.port));
    }
    impl->port = impl->opts.port;
  }
}

HttpServer::~HttpServer() {
  stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpServer::port() const {
  return impl_->port;
}
const std::string& HttpServer::host() const {
  return impl_->opts.host;
}

std::string HttpServer::url() const {
  const std::string& h = impl_->opts.host;
  const bool v6 = h.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + h + "]" : h) + ":" + std::to_string(impl_->port);
}

void HttpServer::start() {
  WC_ENFORCE(!impl_->thread.joinable(), "server already started");
  impl_->thread = std::thread([this] { run(); });
}

void HttpServer::run() {
  impl_->entered = true;
  if (!impl_->stopped) impl_->server->listen_after_bind();
  impl_->done = true;
}

void HttpServer::stop() {
  impl_->stopped = true;
  if (!impl_->entered) return;
  // The library ignores stop() until its accept loop runs; repeat until run() has returned.
  // Bounded: handlers finish within their own deadlines.
  const auto deadline = comm::deadline_after(comm::Millis(30000));
  while (!impl_->done && !comm::expired(deadline)) {
    if (impl_->server->is_running()) impl_->server->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace weightcast::sync::engine

// For the EngineClient tests: an httplib server on an ephemeral loopback port, serving from its
// own thread, and client options with short timeouts.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "sync/trainer/http/engine_client.h"

namespace weightcast::sync::trainer::testing {

class HttpTestServer {
 public:
  HttpTestServer() {
    server_.set_tcp_nodelay(true);  // as the engine's server: keep-alive answers without delay
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until the accept loop runs, so wait for it (bounded).
    for (int i = 0; i < 500 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~HttpTestServer() { stop(); }
  HttpTestServer(const HttpTestServer&) = delete;
  HttpTestServer& operator=(const HttpTestServer&) = delete;

  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  httplib::Server& http() { return server_; }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

inline EngineClientOptions fast_client_options(std::string token = "") {
  EngineClientOptions o;
  o.token = std::move(token);
  o.connect_timeout = comm::Millis(1000);
  o.request_timeout = comm::Millis(2000);
  o.data_timeout = comm::Millis(2000);
  return o;
}

}  // namespace weightcast::sync::trainer::testing

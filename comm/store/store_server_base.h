// StoreServerBase: what TcpStoreServer and C10dStoreServer share, one ConnectionServer
// (comm/store/connection_server.h) that serves their protocol: the address and port it listens
// on, its connection counters, and stop(). A server calls listen() once its own state is ready,
// and stop() from its destructor, before that state goes: connection threads use it until stop()
// has joined them.
// Threading: port(), host() and stop() are thread-safe once listen() has returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/non_copyable.h"

namespace weightcast::comm {

class ConnectionServer;
struct ConnectionServerOptions;

class StoreServerBase : NonCopyable {
 public:
  std::uint16_t port() const;
  const std::string& host() const;  // the bound address, as given
  // Idempotent: wakes the server's own blocked waiters (the `wake` given to listen()), then
  // closes every connection, so blocked clients see EOF, and joins its thread.
  void stop();

 protected:
  StoreServerBase();
  ~StoreServerBase();

  // Binds and listens, or throws ConfigError; the caller starts the returned server.
  ConnectionServer& listen(const ConnectionServerOptions& opts, std::function<void()> wake);
  const ConnectionServer& connections() const { return *server_; }

 private:
  std::unique_ptr<ConnectionServer> server_;
  std::function<void()> wake_;
};

}  // namespace weightcast::comm

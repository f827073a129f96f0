// ConnectionServer: the listening half both store servers share (internal to comm/store). It
// binds an address and an ephemeral or given port that it keeps, runs one acceptor thread and
// one thread per accepted connection, turns connections away past max_connections, reaps
// finished connection threads, and on stop() shuts every connection down and joins its thread.
// The protocol is the owner's: `serve` runs on a connection's own thread with the connection's
// fd, and `refuse` (optional) may answer a connection over the limit before it is closed.
//
// Lifetime: a connection's fd is closed only after its thread has been joined (by the reaper or
// by stop()), so shutdown() from stop() never hits a recycled descriptor. Every wait of the
// acceptor is bounded and checks the stop flag, which serve functions pass to the socket helpers
// (socket_io.h) so they notice stop() promptly. Threading: stop() and the accessors are
// thread-safe; start() is called once, by the owner, before any other thread uses the server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace weightcast::comm {

struct ConnectionServerOptions {
  std::string bind_address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: ephemeral
  std::size_t max_connections = 512;
  std::string name = "server";  // names the server in errors ("store server cannot listen ...")
};

// Counters since construction.
struct ConnectionCounts {
  std::uint64_t accepted = 0;  // connections taken into service
  std::uint64_t refused = 0;   // turned away at max_connections, or no thread could be started
  std::uint64_t active = 0;    // connections being served now
};

class ConnectionServer {
 public:
  // Serves one connection on its own thread; returning (or throwing) ends the connection. The fd
  // stays open until the thread is joined.
  using Serve = std::function<void(int fd)>;
  // Runs on the acceptor for a connection over max_connections; the fd is closed afterwards.
  using Refuse = std::function<void(int fd)>;

  explicit ConnectionServer(ConnectionServerOptions opts);  // binds and listens, or ConfigError
  ~ConnectionServer();                                      // stop()
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  // Starts the acceptor; call once.
  void start(Serve serve, Refuse refuse = {});

  std::uint16_t port() const;
  const std::string& host() const;  // the bound address, as given
  ConnectionCounts counts() const;
  // Set once stop() begins; pass it to the socket helpers as their stop flag.
  const std::atomic<bool>& stopping() const;

  // Idempotent. Sets the stop flag, runs `wake` (for the owner to wake threads blocked on its
  // own conditions), joins the acceptor, closes the listener, then shuts every connection down
  // (clients see EOF at once) and joins its thread.
  void stop(const std::function<void()>& wake = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcast::comm

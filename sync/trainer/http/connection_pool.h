// ConnectionPool: keep-alive HTTP connections to one engine, reused across an update's requests.
//
// An update makes a handful of requests per engine within milliseconds (pause, flush, begin, the
// buckets, version, end, continue); opening a TCP connection for each measured 0.3-0.6 ms on
// loopback, a tenth of a colocated update of 232 MiB (docs/performance.md, "Control plane").
// A Lease hands one connection to one request at a time; requests in flight at once each get
// their own, so the bucket sender's parallel requests never queue behind each other.
//
// A connection goes back to the pool only after a whole 2xx answer (Lease::keep()): one whose
// request failed or timed out may still carry a late answer, and one refused before its body was
// read may still carry that body. It is not reused once idle for `max_idle`: servers close idle
// keep-alive connections (ours after ServerOptions::keep_alive_timeout, 2 s; uvicorn's default
// is 5 s), and a request written into a connection the server is closing fails without telling
// whether the server acted on it, so reuse stays well inside that window and a failed request is
// never retried. Expired connections are closed by the next acquire(); the EngineClient's owner
// closes all idle ones when an operation ends (EngineApi::close_idle_connections), so none stays
// open between updates.
// Threading: acquire() and the leases' destructors are safe to call concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace httplib {
class Client;
}

namespace weightcast::sync::trainer {

class ConnectionPool {
 public:
  using Clock = std::chrono::steady_clock;

  // Half a second: well inside any server's idle timeout (ours 2 s, uvicorn's 5 s), and long
  // enough for the requests of an update, which come milliseconds apart.
  static constexpr std::chrono::milliseconds kDefaultMaxIdle{500};
  // A thread-per-connection server (cpp-httplib's: the engine's 32 handler threads) holds a
  // thread for each connection kept open, until its idle timeout closes it: a few per client.
  static constexpr std::size_t kMaxIdle = 4;

  // `url` is "scheme://host:port"; at most kMaxIdle connections kept, each for `max_idle`.
  // max_idle 0: no keep-alive at all (every request on a new connection, closed after it).
  explicit ConnectionPool(std::string url, std::chrono::milliseconds max_idle = kDefaultMaxIdle);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  class Lease {
   public:
    Lease(Lease&&) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    httplib::Client& client() { return *client_; }
    // True when the connection served a request before (its socket may be open already).
    bool reused() const { return reused_; }
    // The request got a complete answer: the connection may serve the next one.
    void keep() { keep_ = true; }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, std::unique_ptr<httplib::Client> client, bool reused);
    ConnectionPool* pool_;
    std::unique_ptr<httplib::Client> client_;
    bool reused_;
    bool keep_ = false;
  };

  // An idle connection kept within max_idle, else a new client (it connects on its first send).
  Lease acquire();

  // Closes every idle connection (the pool stays usable).
  void close_idle();

  std::size_t idle() const;
  // Connections handed out that had served a request before; for tests and diagnostics.
  std::size_t reuses() const;

 private:
  void give_back(std::unique_ptr<httplib::Client> client);

  struct Idle {
    std::unique_ptr<httplib::Client> client;
    Clock::time_point since;
  };
  const std::string url_;
  const std::chrono::milliseconds max_idle_;
  mutable std::mutex mu_;
  std::vector<Idle> idle_;  // most recently returned last
  std::size_t reuses_ = 0;
};

}  // namespace weightcast::sync::trainer

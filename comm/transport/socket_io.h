// Socket helpers for the TCP store (internal to comm/store): an owning fd, name resolution,
// listen/connect, the store clients' connect retry, and send/receive bounded by a deadline. Sockets
// are non-blocking and every wait is a poll() with a timeout, so no call blocks past its deadline;
// a stop flag, when given, is checked at least every kStopPollSlice so server threads notice stop()
// promptly. Writes never raise SIGPIPE (MSG_NOSIGNAL, or SO_NOSIGPIPE where that is the mechanism).
// Lifetime: Fd closes on destruction. Threading: functions are reentrant; an Fd has one owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "comm/deadline.h"

namespace weightcast::comm::net {

inline constexpr Millis kStopPollSlice{50};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

enum class Io { kOk, kTimeout, kClosed, kError, kStopped };

// Result of an I/O helper: kError carries errno in `err`.
struct IoResult {
  Io io = Io::kOk;
  int err = 0;
  bool ok() const { return io == Io::kOk; }
  std::string describe() const;  // "timed out", "connection closed by peer", strerror...
};

// "host:port", bracketing IPv6 literals: the form errors use to name a store endpoint.
std::string endpoint(std::string_view host, std::uint16_t port);

// Binds host:port (host: IPv4/IPv6 literal or name; port 0 = ephemeral) and listens. Returns an
// invalid Fd and sets *error on failure; *bound_port receives the port actually bound.
Fd listen_on(const std::string& host, std::uint16_t port, std::uint16_t* bound_port,
             std::string* error);

// Accepts one pending connection (non-blocking, close-on-exec); invalid Fd when none is ready.
Fd accept_one(int listener, int* err);

// One attempt at each address `host` resolves to, each bounded by `deadline`. On failure returns
// an invalid Fd and describes the last error in *error (and *timed_out when the deadline passed).
Fd connect_once(const std::string& host, std::uint16_t port, Deadline deadline, std::string* error,
                bool* timed_out);

// The pacing and final errors of a store client's connect-and-retry loop. After each failed
// attempt, failed(why) throws PeerError("cannot reconnect to the <server>: <why>") when the loop
// does not retry, TimeoutError("could not connect to the <store> at <peer> within <ms> ms: <why>")
// once the deadline has passed, and otherwise sleeps before the next attempt (10 ms, doubling up
// to 500 ms, never past the deadline).
class ConnectRetry {
 public:
  // `server` and `store` name the server in the two errors; `connect_timeout` is the budget the
  // timeout error reports.
  ConnectRetry(std::string_view peer, std::string_view server, std::string_view store,
               Millis connect_timeout, Deadline deadline, bool retry)
      : peer_(peer),
        server_(server),
        store_(store),
        connect_timeout_(connect_timeout),
        deadline_(deadline),
        retry_(retry) {}

  void failed(const std::string& why);

 private:
  std::string_view peer_, server_, store_;
  Millis connect_timeout_;
  Deadline deadline_;
  bool retry_;
  Millis backoff_{10};
};

// Waits until `fd` is readable (data or EOF), the deadline passes or *stop becomes true.
IoResult wait_readable(int fd, Deadline deadline, const std::atomic<bool>* stop = nullptr);

IoResult send_all(int fd, std::string_view data, Deadline deadline,
                  const std::atomic<bool>* stop = nullptr);

// Reads exactly `n` bytes into `buf`.
IoResult recv_exact(int fd, char* buf, std::size_t n, Deadline deadline,
                    const std::atomic<bool>* stop = nullptr);

// Appends exactly `n` bytes to *out, growing it as bytes arrive, so memory follows what the peer
// actually sent rather than what it claimed.
IoResult recv_append(int fd, std::string* out, std::size_t n, Deadline deadline,
                     const std::atomic<bool>* stop = nullptr);

// "address:port" of a connected socket's peer (for logs), or "unknown peer".
std::string peer_name(int fd);

// True when the peer has closed or reset the connection (checked without blocking).
bool peer_hung_up(int fd);

// Half-closes for writing and discards what the peer still sends (bounded by `linger` and a byte
// budget), so a reply written just before is not destroyed by a reset when the fd is closed.
void shutdown_and_drain(int fd, Millis linger, const std::atomic<bool>* stop = nullptr);

}  // namespace weightcast::comm::net

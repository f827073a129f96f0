// Socket-level probes for the security tests: a raw TCP connection that can send anything and
// watch for the peer closing, a listening socket that records whether anyone connected, and the
// local addresses a process listens on (read from /proc/<pid>/fd and /proc/net/tcp{,6}).
// Lifetime: sockets close on destruction. Threading: one owner thread per object.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcast::security {

class RawConnection {
 public:
  // Connects to host:port (IPv4 literal); connected() is false when it could not within 5 s.
  RawConnection(const std::string& host, int port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  RawConnection(RawConnection&& other) noexcept;

  bool connected() const { return fd_ >= 0; }
  // False when the peer is gone (EPIPE / reset) before everything was written.
  bool send(const std::string& bytes);
  // Up to `n` bytes within `timeout`; *closed is set when the peer closed or reset.
  std::string read(std::size_t n, std::chrono::milliseconds timeout, bool* closed = nullptr);
  // One HTTP response (head, then Content-Length bytes of body), or what arrived of it within
  // `timeout`.
  std::string read_http_response(std::chrono::milliseconds timeout);
  // True when the peer closes (EOF or reset) within `timeout`; bytes before that are dropped.
  bool closed_within(std::chrono::milliseconds timeout);
  // Closes with an RST, like a crashed peer.
  void reset();

 private:
  int fd_ = -1;
};

// Whether a plain TCP connect to host:port succeeds within `timeout`.
bool can_connect(const std::string& host, int port, std::chrono::milliseconds timeout);

// A listening socket on `host`, ephemeral port, that never speaks: used as a fake store to see
// whether a server dialled it.
class Listener {
 public:
  explicit Listener(const std::string& host);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int port() const { return port_; }
  // Accepts one pending connection within `timeout`; true when one arrived (it is then closed).
  bool accepted_within(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct ListeningSocket {
  std::string address;  // "127.0.0.1", "0.0.0.0", "::", "::1", ...
  int port = 0;
};

// Every TCP socket in LISTEN state that process `pid` holds open.
std::vector<ListeningSocket> listening_sockets(pid_t pid);

}  // namespace weightcast::security

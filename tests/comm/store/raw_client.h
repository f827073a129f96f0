// RawClient: a bare TCP connection for store tests that must speak the wire protocol badly on
// purpose (garbage, half frames, lying lengths) or watch exactly what the server sends back.
// Lifetime: closes its socket on destruction. Threading: one owner thread.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "comm/store/store_protocol.h"

namespace weightcast::testing {

class RawClient {
 public:
  // Connects to 127.0.0.1:port; fails the test (fd stays -1) when it cannot.
  explicit RawClient(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ADD_FAILURE() << "raw connect to port " << port << " failed";
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  int fd() const { return fd_; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes with an RST instead of a FIN, like a crashed peer.
  void reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close();
  }

  bool send(const std::string& bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Reads up to `n` bytes, waiting at most `timeout` overall; returns what arrived (short at EOF
  // or timeout). *eof is set when the peer closed.
  std::string read(std::size_t n, std::chrono::milliseconds timeout, bool* eof = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string out;
    if (eof) *eof = false;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (r <= 0) {
        if (eof) *eof = true;
        break;
      }
      out.append(buf, static_cast<std::size_t>(r));
    }
    return out;
  }

  // Reads one response frame; nullopt when none arrives in time or it does not decode.
  std::optional<comm::store_protocol::Response> read_response(std::chrono::milliseconds timeout) {
    namespace proto = comm::store_protocol;
    std::string header = read(proto::kFrameHeaderBytes, timeout);
    if (header.size() != proto::kFrameHeaderBytes) return std::nullopt;
    const auto length = proto::decode_frame_length(header);
    if (length > (1u << 20)) return std::nullopt;
    std::string body = read(length, timeout);
    if (body.size() != length) return std::nullopt;
    auto d = proto::decode_response_body(body, 1u << 20);
    if (!d.ok()) return std::nullopt;
    return d.value;
  }

  // True when the server closes the connection within `timeout` (EOF or reset), discarding any
  // bytes that arrive first.
  bool closed_within(std::chrono::milliseconds timeout) {
    bool eof = false;
    read(SIZE_MAX, timeout, &eof);
    return eof;
  }

 private:
  int fd_ = -1;
};

inline std::string hello_frame(const std::string& token) {
  comm::store_protocol::Request r;
  r.op = comm::store_protocol::Op::kHello;
  r.keys = {std::string(comm::store_protocol::kProtocolName)};
  r.value = token;
  return comm::store_protocol::encode_request(r);
}

}  // namespace weightcast::testing

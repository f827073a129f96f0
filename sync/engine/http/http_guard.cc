#include "sync/engine/http/http_guard.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace weightcast::sync::engine {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds to_millis(time_t sec, time_t usec) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(sec) * 1000 + usec / 1000);
}

// poll() for `events` until `deadline`; false on timeout or error.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1 << 30)));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

struct GuardLimits {
  std::size_t max_head_bytes = kMaxRequestHeadBytes;
  std::size_t max_body_bytes = 0;
  std::chrono::milliseconds read_timeout{0};   // per read, and for the whole request
  std::chrono::milliseconds write_timeout{0};  // per write, and for the whole response
};

// One connection, read through a small buffer. Bytes are counted as httplib takes them (its
// header parser takes one byte at a time), so the head scan sees exactly the request's head.
class GuardedStream final : public httplib::Stream {
 public:
  GuardedStream(int fd, GuardLimits limits) : fd_(fd), limits_(limits) {}

  // Resets the per-request budgets; called before each request of a keep-alive connection.
  void begin_request() {
    head_bytes_ = 0;
    head_done_ = false;
    tail_ = 0;
    line_.clear();
    line_long_ = false;
    chunked_ = false;
    content_length_.reset();
    body_left_ = 0;
    body_read_ = 0;
    read_deadline_ = Clock::now() + limits_.read_timeout;
    write_deadline_.reset();
    refused_ = false;
  }

  // Waits up to `timeout` for the next request's first byte, giving up early once `running`
  // turns false (the server is stopping).
  bool wait_request(std::chrono::milliseconds timeout, const std::atomic<socket_t>& svr) {
    if (pos_ < end_) return true;
    const auto deadline = Clock::now() + timeout;
    while (svr != INVALID_SOCKET) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (wait_for(fd_, POLLIN, slice)) return true;
      if (Clock::now() >= deadline) return false;
    }
    return false;
  }

  bool is_readable() const override {
    return pos_ < end_ || wait_for(fd_, POLLIN, Clock::now() + limits_.read_timeout);
  }
  bool is_writable() const override {
    return wait_for(fd_, POLLOUT, Clock::now() + limits_.write_timeout);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if ((head_done_ && body_left_ == 0) || (!head_done_ && head_bytes_ >= limits_.max_head_bytes)) {
      refused_ = true;  // over the body or head budget
      return -1;
    }
    if (pos_ == end_ && !fill()) return pos_ == end_ && eof_ ? 0 : -1;
    std::size_t n = std::min(size, end_ - pos_);
    if (head_done_) {
      n = std::min(n, body_left_);
      body_left_ -= n;
      body_read_ += n;
    } else {
      std::size_t i = 0;
      while (i < n && !head_done_ && head_bytes_ < limits_.max_head_bytes) scan(buf_[pos_ + i++]);
      n = i;
    }
    std::copy(buf_ + pos_, buf_ + pos_ + n, ptr);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!write_deadline_) write_deadline_ = Clock::now() + limits_.write_timeout;
    if (!wait_for(fd_, POLLOUT, std::min(*write_deadline_, Clock::now() + limits_.write_timeout)))
      return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return fd_; }

  // Whether the last request was cut short by a budget or deadline: its client may still be
  // sending.
  bool refused() const { return refused_; }
  // Whether the last request declared a body that was not read whole (answered before it was:
  // a refusal, or a chunked body): what follows on the connection cannot be framed.
  bool body_unread() const {
    return head_done_ && (chunked_ || (content_length_ && *content_length_ > body_read_));
  }

 private:
  bool fill() {
    const auto deadline = std::min(read_deadline_, Clock::now() + limits_.read_timeout);
    if (!wait_for(fd_, POLLIN, deadline)) {
      refused_ = true;  // too slow
      return false;
    }
    const ssize_t r = ::recv(fd_, buf_, sizeof(buf_), 0);
    if (r <= 0) {
      eof_ = r == 0;
      return false;
    }
    pos_ = 0;
    end_ = static_cast<std::size_t>(r);
    return true;
  }

  // Follows the head byte by byte: its end (an empty line) and the two headers that size the
  // body. Header names are compared case-insensitively, as HTTP defines them.
  void scan(char c) {
    ++head_bytes_;
    tail_ = (tail_ << 8) | static_cast<unsigned char>(c);
    if (c == '\n') {
      header_line();
      if ((tail_ & 0xffffffffu) == 0x0d0a0d0au || (tail_ & 0xffffu) == 0x0a0au) finish_head();
      line_.clear();
      line_long_ = false;
    } else if (line_.size() < 64) {
      line_.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else {
      line_long_ = true;
    }
  }

  void header_line() {
    auto value_of = [&](std::string_view name) -> std::optional<std::string_view> {
      if (line_.compare(0, name.size(), name) != 0) return std::nullopt;
      std::string_view v(line_);
      v.remove_prefix(name.size());
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == ' ' || v.back() == '\t'))
        v.remove_suffix(1);
      return v;
    };
    if (value_of("transfer-encoding:")) chunked_ = true;
    if (auto v = value_of("content-length:")) {
      std::uint64_t n = 0;
      bool digits = !v->empty() && !line_long_;
      for (char d : *v) {
        digits = digits && d >= '0' && d <= '9' && n <= (UINT64_MAX - 9) / 10;
        if (digits) n = n * 10 + static_cast<std::uint64_t>(d - '0');
      }
      // An unreadable or very long value counts as huge: httplib will refuse or skip it.
      const std::uint64_t length = digits ? n : std::numeric_limits<std::uint64_t>::max();
      content_length_ = std::max(content_length_.value_or(0), length);
    }
  }

  void finish_head() {
    head_done_ = true;
    const std::size_t limit = limits_.max_body_bytes;
    if (chunked_ || !content_length_) {
      body_left_ = limit > (std::numeric_limits<std::size_t>::max() - 65536) / 2
                       ? std::numeric_limits<std::size_t>::max()
                       : 2 * limit + 65536;
    } else {
      body_left_ = *content_length_ > limit ? 0 : static_cast<std::size_t>(*content_length_);
    }
  }

  const int fd_;
  const GuardLimits limits_;
  char buf_[4096];
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
  bool eof_ = false;
  std::size_t head_bytes_ = 0;
  bool head_done_ = false;
  std::uint64_t tail_ = 0;
  std::string line_;
  bool line_long_ = false;
  bool chunked_ = false;
  std::optional<std::uint64_t> content_length_;
  std::size_t body_left_ = 0;
  std::uint64_t body_read_ = 0;
  Clock::time_point read_deadline_{};
  std::optional<Clock::time_point> write_deadline_;
  bool refused_ = false;
};

class GuardedServer final : public httplib::Server {
 private:
  // Replaces httplib's own connection loop (the same keep-alive rules) to read through the guard.
  bool process_and_close_socket(socket_t sock) override {
    GuardLimits limits;
    limits.max_body_bytes = payload_max_length_;
    limits.read_timeout = to_millis(read_timeout_sec_, read_timeout_usec_);
    limits.write_timeout = to_millis(write_timeout_sec_, write_timeout_usec_);
    GuardedStream stream(sock, limits);
    const auto keep_alive = std::chrono::seconds(keep_alive_timeout_sec_);
    bool ok = false;
    bool dropped = false;  // the last request failed or was cut: its client may still be sending
    for (std::size_t left = keep_alive_max_count_; left > 0; --left) {
      if (svr_sock_ == INVALID_SOCKET || !stream.wait_request(keep_alive, svr_sock_)) break;
      stream.begin_request();
      bool closed = false;
      ok = process_request(stream, /*close_connection=*/left == 1, closed, nullptr);
      dropped = !ok || stream.refused() || stream.body_unread();
      // A refused request's body was not consumed, so the stream's framing is lost: never read a
      // next request from it.
      if (!ok || closed || dropped) break;
    }
    if (dropped) linger(sock, std::min(limits.read_timeout, std::chrono::milliseconds(2000)));
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  // Closing a socket with unread input resets the connection, and a client still sending its
  // body (one answered 413, say) would lose the answer. So: send FIN, then discard what arrives
  // until the client closes or `budget` passes; nothing is kept, whatever it sends.
  static void linger(socket_t sock, std::chrono::milliseconds budget) {
    ::shutdown(sock, SHUT_WR);
    const auto deadline = Clock::now() + budget;
    char sink[4096];
    while (wait_for(sock, POLLIN, deadline)) {
      if (::recv(sock, sink, sizeof(sink), 0) <= 0) return;
    }
  }
};

}  // namespace

std::unique_ptr<httplib::Server> make_guarded_http_server() {
  return std::make_unique<GuardedServer>();
}

}  // namespace weightcast::sync::engine

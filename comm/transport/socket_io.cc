#include "comm/transport/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/enum_names.h"
#include "comm/errors.h"

namespace weightcast::comm::net {

namespace {

#ifdef MSG_NOSIGNAL
constexpr int kSendFlags = MSG_NOSIGNAL;
#else
constexpr int kSendFlags = 0;
#endif

constexpr std::size_t kRecvChunk = 64 * 1024;
constexpr std::size_t kDrainBudget = 1 << 20;
constexpr Millis kMaxBackoff{500};  // the longest sleep between two connection attempts

void configure(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
  (void)::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// Polls `fd` for `events`, in slices when a stop flag is given. kOk means ready.
IoResult poll_for(int fd, short events, Deadline deadline, const std::atomic<bool>* stop) {
  while (true) {
    if (stop && stop->load()) return {Io::kStopped, 0};
    Millis left = remaining(deadline);
    if (left.count() == 0 && expired(deadline)) return {Io::kTimeout, 0};
    if (stop) left = std::min(left, kStopPollSlice);
    // Round up so a sub-millisecond remainder does not spin.
    const int wait_ms = static_cast<int>(std::min<long long>(left.count() + 1, 60'000));
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, wait_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return {Io::kError, errno};
    }
    if (r > 0) return {Io::kOk, 0};
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, std::uint16_t port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    *error = detail::concat("cannot resolve '", host, "': ", ::gai_strerror(rc));
    return nullptr;
  }
  return AddrInfoPtr(res);
}

// A close-on-exec socket for the address `a`, or an invalid Fd with `error` set.
Fd open_socket(const addrinfo& a, std::string* error) {
  Fd fd(::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC, a.ai_protocol));
  if (!fd) *error = detail::concat("socket: ", std::strerror(errno));
  return fd;
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string IoResult::describe() const {
  static constexpr auto kNames =
      enum_names<Io>("I/O result", {{Io::kOk, "ok"},
                                    {Io::kTimeout, "timed out"},
                                    {Io::kClosed, "connection closed by peer"},
                                    {Io::kStopped, "stopped"}});
  if (io == Io::kError) return std::strerror(err);
  return std::string(kNames.name_or(io, "unknown"));
}

std::string endpoint(std::string_view host, std::uint16_t port) {
  if (host.find(':') != std::string_view::npos) return detail::concat("[", host, "]:", port);
  return detail::concat(host, ":", port);
}

Fd listen_on(const std::string& host, std::uint16_t port, std::uint16_t* bound_port,
             std::string* error) {
  auto addrs = resolve(host, port, /*passive=*/true, error);
  if (!addrs) return {};
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd fd = open_socket(*a, error);
    if (!fd) continue;
    // Lets a restarted server take its port back while old connections sit in TIME_WAIT; it
    // never allows two listeners on one port.
    int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      *error = detail::concat("bind ", endpoint(host, port), ": ", std::strerror(errno));
      continue;
    }
    if (::listen(fd.get(), 128) != 0) {
      *error = detail::concat("listen ", endpoint(host, port), ": ", std::strerror(errno));
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      *error = detail::concat("getsockname: ", std::strerror(errno));
      continue;
    }
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    configure(fd.get());
    return fd;
  }
  return {};
}

Fd accept_one(int listener, int* err) {
  int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return {};
  }
  configure(fd);
  return Fd(fd);
}

Fd connect_once(const std::string& host, std::uint16_t port, Deadline deadline, std::string* error,
                bool* timed_out) {
  *timed_out = false;
  auto addrs = resolve(host, port, /*passive=*/false, error);
  if (!addrs) return {};
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd fd = open_socket(*a, error);
    if (!fd) continue;
    configure(fd.get());
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) {
      *error = std::strerror(errno);
      continue;
    }
    IoResult r = poll_for(fd.get(), POLLOUT, deadline, nullptr);
    if (!r.ok()) {
      *timed_out = r.io == Io::kTimeout;
      *error = r.describe();
      continue;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error == 0) return fd;
    *error = std::strerror(so_error);
  }
  return {};
}

void ConnectRetry::failed(const std::string& why) {
  if (!retry_) {
    throw PeerError(std::string(peer_),
                    detail::concat("cannot reconnect to the ", server_, ": ", why));
  }
  if (expired(deadline_)) {
    throw TimeoutError(detail::concat("could not connect to the ", store_, " at ", peer_,
                                      " within ", connect_timeout_.count(), " ms: ", why));
  }
  std::this_thread::sleep_for(std::min(backoff_, remaining(deadline_)));
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
}

IoResult wait_readable(int fd, Deadline deadline, const std::atomic<bool>* stop) {
  return poll_for(fd, POLLIN, deadline, stop);
}

IoResult send_all(int fd, std::string_view data, Deadline deadline, const std::atomic<bool>* stop) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), kSendFlags);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult r = poll_for(fd, POLLOUT, deadline, stop);
      if (!r.ok()) return r;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return {Io::kClosed, errno};
    return {Io::kError, n < 0 ? errno : EIO};
  }
  return {};
}

IoResult recv_exact(int fd, char* buf, std::size_t n, Deadline deadline,
                    const std::atomic<bool>* stop) {
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, buf + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return {Io::kClosed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult p = poll_for(fd, POLLIN, deadline, stop);
      if (!p.ok()) return p;
      continue;
    }
    if (errno == ECONNRESET) return {Io::kClosed, errno};
    return {Io::kError, errno};
  }
  return {};
}

IoResult recv_append(int fd, std::string* out, std::size_t n, Deadline deadline,
                     const std::atomic<bool>* stop) {
  const std::size_t start = out->size();
  std::size_t got = 0;
  while (got < n) {
    const std::size_t chunk = std::min(kRecvChunk, n - got);
    out->resize(start + got + chunk);
    IoResult r = recv_exact(fd, out->data() + start + got, chunk, deadline, stop);
    if (!r.ok()) {
      out->resize(start + got);
      return r;
    }
    got += chunk;
  }
  return {};
}

bool peer_hung_up(int fd) {
#ifdef POLLRDHUP
  const short events = POLLRDHUP;
#else
  const short events = 0;
#endif
  pollfd p{fd, events, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLHUP | POLLERR | events)) != 0;
}

void shutdown_and_drain(int fd, Millis linger, const std::atomic<bool>* stop) {
  ::shutdown(fd, SHUT_WR);
  const Deadline deadline = deadline_after(linger);
  std::size_t drained = 0;
  char buf[4096];
  while (drained < kDrainBudget) {
    if (!poll_for(fd, POLLIN, deadline, stop).ok()) return;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0) return;
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    drained += static_cast<std::size_t>(r);
  }
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    return endpoint(text, ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return endpoint(text, ntohs(a->sin6_port));
  }
  return "unknown peer";
}

}  // namespace weightcast::comm::net

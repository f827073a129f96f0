#include "tests/security/net_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace weightcast::security {

namespace {

sockaddr_in ipv4(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    throw std::invalid_argument("not an IPv4 literal: " + host);
  }
  return a;
}

// Non-blocking connect bounded by `timeout`; returns the connected (blocking) fd or -1.
int connect_fd(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const sockaddr_in a = ipv4(host, port);
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = ETIMEDOUT;
    if (::poll(&p, 1, static_cast<int>(timeout.count())) == 1) {
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    rc = err == 0 ? 0 : -1;
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// /proc/net/tcp prints each 32-bit word of an address in host byte order.
std::string decode_address(const std::string& hex) {
  unsigned char bytes[16] = {};
  const std::size_t words = hex.size() / 8;
  for (std::size_t w = 0; w < words; ++w) {
    const auto v = static_cast<std::uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
    for (int b = 0; b < 4; ++b)
      bytes[w * 4 + b] = static_cast<unsigned char>((v >> (8 * b)) & 0xff);
  }
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(words == 1 ? AF_INET : AF_INET6, bytes, text, sizeof(text));
  return text;
}

}  // namespace

RawConnection::RawConnection(const std::string& host, int port)
    : fd_(connect_fd(host, port, std::chrono::seconds(5))) {}

RawConnection::~RawConnection() {
  if (fd_ >= 0) ::close(fd_);
}

RawConnection::RawConnection(RawConnection&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

bool RawConnection::send(const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 5000) != 1) return false;
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

std::string RawConnection::read(std::size_t n, std::chrono::milliseconds timeout, bool* closed) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  if (closed) *closed = false;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (r <= 0) {
      if (closed) *closed = true;
      break;
    }
    out.append(buf, static_cast<std::size_t>(r));
  }
  return out;
}

std::string RawConnection::read_http_response(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
  };
  std::string out;
  std::size_t head_end = std::string::npos;
  while (head_end == std::string::npos && left().count() > 0) {
    bool closed = false;
    const std::string got = read(1, left(), &closed);
    out += got;
    head_end = out.find("\r\n\r\n");
    if (closed || got.empty()) return out;
  }
  if (head_end == std::string::npos) return out;
  std::size_t length = 0;
  std::string lower = out.substr(0, head_end);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (const auto at = lower.find("\r\ncontent-length:"); at != std::string::npos) {
    length = std::stoul(lower.substr(at + 17));
  }
  return out + read(length, left());
}

bool RawConnection::closed_within(std::chrono::milliseconds timeout) {
  bool closed = false;
  read(SIZE_MAX, timeout, &closed);
  return closed;
}

void RawConnection::reset() {
  if (fd_ < 0) return;
  linger l{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd_);
  fd_ = -1;
}

bool can_connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const int fd = connect_fd(host, port, timeout);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

Listener::Listener(const std::string& host) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const sockaddr_in a = ipv4(host, 0);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd_, 16) != 0) {
    throw std::runtime_error("cannot listen on " + host);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

bool Listener::accepted_within(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return false;
  ::close(c);
  return true;
}

std::vector<ListeningSocket> listening_sockets(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<ListeningSocket> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      const auto colon = local.find(':');
      out.push_back({decode_address(local.substr(0, colon)),
                     static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16))});
    }
  }
  return out;
}

}  // namespace weightcast::security

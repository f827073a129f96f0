#include "comm/colocate/handle_exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "comm/errors.h"

namespace weightcast::comm::colocate {
namespace {

constexpr std::size_t kMaxMessage = 512;

void check_peer_uid(int socket_fd) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    throw Error(std::string("colocated handle: SO_PEERCRED: ") + std::strerror(errno));
  }
  if (peer.uid != getuid()) {
    throw Error("colocated handle: peer uid " + std::to_string(peer.uid) +
                " is not this process's user");
  }
}

void wait_readable(int socket_fd, std::chrono::milliseconds timeout) {
  pollfd entry{socket_fd, POLLIN, 0};
  const int ready = poll(&entry, 1, static_cast<int>(timeout.count()));
  if (ready == 0) {
    throw TimeoutError("colocated handle: no handle within " + std::to_string(timeout.count()) +
                       " ms");
  }
  if (ready < 0) {
    throw Error(std::string("colocated handle: poll: ") + std::strerror(errno));
  }
}

// Returns the single attached descriptor (or -1); closes every other one.
int take_descriptor(msghdr& message) {
  int taken = -1;
  int count = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      continue;
    }
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (++count == 1) {
        taken = fd;
      } else {
        close(fd);
      }
    }
  }
  if (count != 1 && taken >= 0) {
    close(taken);
    taken = -1;
  }
  return taken;
}

}  // namespace

void send_handle(int socket_fd, const std::string& token, int segment_fd, std::size_t size) {
  const std::string text = token + " " + std::to_string(size);
  if (text.size() > kMaxMessage) {
    throw Error("colocated handle: token too long");
  }
  iovec io{const_cast<char*>(text.data()), text.size()};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &segment_fd, sizeof(int));
  if (sendmsg(socket_fd, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    throw Error(std::string("colocated handle: sendmsg: ") + std::strerror(errno));
  }
}

ReceivedHandle receive_handle(int socket_fd, const std::string& expected_token,
                              std::chrono::milliseconds timeout) {
  check_peer_uid(socket_fd);
  wait_readable(socket_fd, timeout);
  std::array<char, kMaxMessage + 1> text{};
  iovec io{text.data(), kMaxMessage};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 4)> control{};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  const ssize_t got = recvmsg(socket_fd, &message, MSG_CMSG_CLOEXEC);
  if (got <= 0) {
    throw Error("colocated handle: the sender closed without a handle");
  }
  const int fd = take_descriptor(message);
  if (fd < 0 || (message.msg_flags & MSG_CTRUNC) != 0) {
    throw Error("colocated handle: the message does not carry exactly one descriptor");
  }
  const std::string body(text.data(), static_cast<std::size_t>(got));
  const auto space = body.rfind(' ');
  std::size_t size = 0;
  try {
    if (space == std::string::npos || body.substr(0, space) != expected_token) {
      throw Error("colocated handle: the token is not this session's");
    }
    size = std::stoull(body.substr(space + 1));
  } catch (...) {
    close(fd);
    throw Error("colocated handle: refused (foreign token or malformed size)");
  }
  return {fd, size};
}

AbstractAddress abstract_address(const std::string& name) {
  AbstractAddress out;
  out.addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(out.addr.sun_path)) {
    throw Error("abstract socket name '" + name + "': 1 to " +
                std::to_string(sizeof(out.addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(out.addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  out.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return out;
}

HeldHandle fetch_and_hold(const std::string& name, const std::string& expected_token,
                          std::chrono::milliseconds timeout) {
  const AbstractAddress address = abstract_address(name);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("socket(): " + std::string(strerror(errno)));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address.addr), address.length) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error("no trainer serves '" + name + "' on this host (" + strerror(err) + ")");
  }
  try {
    return {receive_handle(fd, expected_token, timeout), fd};
  } catch (...) {
    ::close(fd);
    throw;
  }
}

ReceivedHandle fetch_handle(const std::string& name, const std::string& expected_token,
                            std::chrono::milliseconds timeout) {
  const HeldHandle held = fetch_and_hold(name, expected_token, timeout);
  ::close(held.connection);
  return held.handle;
}

}  // namespace weightcast::comm::colocate

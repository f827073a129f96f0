#include "comm/colocate/segment_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <set>

#include "comm/colocate/handle_exchange.h"
#include "comm/errors.h"

namespace weightcast::comm::colocate {
namespace {

std::string fresh_name() {
  std::random_device rd;
  std::string out = "weightcast-segment-" + std::to_string(::getpid()) + "-";
  for (int i = 0; i < 4; ++i) out += std::to_string(rd() % 10000) + (i < 3 ? "." : "");
  return out;
}

// The live servers of this process, for release_everywhere(). Never destroyed: segments may be
// released from static destructors.
struct Servers {
  std::mutex mu;
  std::set<SegmentServer*> live;
};

Servers& servers() {
  static auto* s = new Servers;
  return *s;
}

// Hangs up on the engine even where a forked child of this process still holds the socket (a
// close alone would not), then closes it.
void hang_up(int connection) {
  ::shutdown(connection, SHUT_RDWR);
  ::close(connection);
}

}  // namespace

SegmentServer::SegmentServer() : name_(fresh_name()) {
  listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener_ < 0) throw Error("segment server: socket(): " + std::string(strerror(errno)));
  const AbstractAddress address = abstract_address(name_);
  if (::bind(listener_, reinterpret_cast<const sockaddr*>(&address.addr), address.length) != 0 ||
      ::listen(listener_, 64) != 0) {
    const int err = errno;
    ::close(listener_);
    throw Error("segment server: cannot listen on '" + name_ + "': " + strerror(err));
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    const int err = errno;
    ::close(listener_);
    throw Error("segment server: eventfd(): " + std::string(strerror(err)));
  }
  Servers& s = servers();
  std::lock_guard lock(s.mu);
  s.live.insert(this);
}

SegmentServer::~SegmentServer() {
  {
    Servers& s = servers();
    std::lock_guard lock(s.mu);
    s.live.erase(this);
  }
  ::close(listener_);
  ::close(wake_fd_);
  for (const Held& h : held_) hang_up(h.connection);
}

void SegmentServer::release(SegmentId id) {
  std::lock_guard lock(held_mu_);
  std::erase_if(held_, [&](const Held& h) {
    if (h.segment != id) return false;
    hang_up(h.connection);
    return true;
  });
}

void SegmentServer::release_everywhere(SegmentId id) {
  Servers& s = servers();
  std::lock_guard lock(s.mu);
  for (SegmentServer* server : s.live) server->release(id);
}

std::size_t SegmentServer::held() {
  std::lock_guard lock(held_mu_);
  reap_locked();
  return held_.size();
}

void SegmentServer::reap_locked() {
  // An engine never writes after taking the handle: a readable connection is one it closed.
  std::erase_if(held_, [](const Held& h) {
    pollfd p{h.connection, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;  // open (or poll failed: keep it, the next reap sees)
    ::close(h.connection);
    return true;
  });
}

void SegmentServer::hold(int connection, SegmentId id) {
  std::lock_guard lock(held_mu_);
  reap_locked();
  if (held_.size() >= kMaxHeld) {
    hang_up(held_.front().connection);
    held_.erase(held_.begin());
  }
  held_.push_back({connection, id});
}

void SegmentServer::wake() {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

bool SegmentServer::answer_one(const std::string& token, int segment_fd, std::size_t size,
                               Millis wait) {
  const int conn = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw Error("segment server: accept(): " + std::string(strerror(errno)));
    }
    pollfd p[2] = {{listener_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(p, 2, static_cast<int>(std::max<std::int64_t>(wait.count(), 0)));
    std::uint64_t wakes = 0;
    if ((p[1].revents & POLLIN) != 0) (void)!::read(wake_fd_, &wakes, sizeof(wakes));
    return false;
  }
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || peer.uid != ::getuid()) {
    ::close(conn);  // another user's process: it gets nothing
    return false;
  }
  try {
    const SegmentId id = segment_id(segment_fd);
    send_handle(conn, token, segment_fd, size);
    // The descriptor travelled in the message; the connection stays open as the engine's hold on
    // its mapping (above).
    hold(conn, id);
  } catch (...) {
    ::close(conn);
    throw;
  }
  return true;
}

void SegmentServer::serve(const std::string& token, int segment_fd, std::size_t size,
                          int connections, Deadline deadline) {
  for (int served = 0; served < connections;) {
    const auto left = remaining(deadline);
    if (left.count() <= 0) {
      throw TimeoutError("segment server: " + std::to_string(served) + " of " +
                         std::to_string(connections) + " engine ranks took the segment in time");
    }
    served += answer_one(token, segment_fd, size, std::min(left, Millis(100))) ? 1 : 0;
  }
}

int SegmentServer::serve_until(const std::string& token, int segment_fd, std::size_t size,
                               const std::function<bool()>& done, Deadline deadline) {
  int served = 0;
  while (!done()) {
    const auto left = remaining(deadline);
    if (left.count() <= 0) {
      throw TimeoutError("segment server: the engines did not finish with the segment in time (" +
                         std::to_string(served) + " took it)");
    }
    served += answer_one(token, segment_fd, size, std::min(left, Millis(20))) ? 1 : 0;
  }
  return served;
}

}  // namespace weightcast::comm::colocate

#include "comm/colocate/segment_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>

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
}

SegmentServer::~SegmentServer() {
  ::close(listener_);
}

void SegmentServer::serve(const std::string& token, int segment_fd, std::size_t size,
                          int connections, Deadline deadline) {
  for (int served = 0; served < connections;) {
    const int conn = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw Error("segment server: accept(): " + std::string(strerror(errno)));
      }
      const auto left = remaining(deadline);
      if (left.count() <= 0) {
        throw TimeoutError("segment server: " + std::to_string(served) + " of " +
                           std::to_string(connections) + " engine ranks took the segment in time");
      }
      pollfd p{listener_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 100)));
      continue;
    }
    try {
      send_handle(conn, token, segment_fd, size);
    } catch (...) {
      ::close(conn);
      throw;
    }
    ::close(conn);  // the descriptor travelled in the message; the engine needs nothing else
    ++served;
  }
}

}  // namespace weightcast::comm::colocate

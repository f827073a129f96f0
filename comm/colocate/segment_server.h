// SegmentServer: the trainer's end of the colocated handle exchange (docs/colocated.md).
//
// Listens on an abstract AF_UNIX socket under a fresh random name (abstract names live in the
// network namespace, never in the file system, and vanish with the socket). serve() answers
// connections with a segment's read-only descriptor and the session token
// (comm/colocate/handle_exchange.h), one per engine rank that maps the bucket, and returns when
// all were answered or the deadline passed. Only processes of the same uid get a descriptor:
// each engine checks the token, and the kernel checks the peer on the engine's side.
// Lifetime: one per trainer rank that sends colocated buckets; destruction closes the socket.
// Threading: serve() from one thread at a time; name() from any.
#pragma once

#include <cstddef>
#include <string>

#include "comm/deadline.h"

namespace weightcast::comm::colocate {

class SegmentServer {
 public:
  // Throws comm::Error when the socket cannot be created.
  SegmentServer();
  SegmentServer(const SegmentServer&) = delete;
  SegmentServer& operator=(const SegmentServer&) = delete;
  ~SegmentServer();

  // The abstract name engines connect to (without the leading NUL).
  const std::string& name() const { return name_; }

  // Hands `segment_fd` (`size` bytes) with `token` to the next `connections` peers. Throws
  // comm::TimeoutError when fewer connected before `deadline`, comm::Error on a failed send.
  void serve(const std::string& token, int segment_fd, std::size_t size, int connections,
             Deadline deadline);

 private:
  std::string name_;
  int listener_ = -1;
};

}  // namespace weightcast::comm::colocate

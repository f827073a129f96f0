// SegmentServer: the trainer's end of the colocated handle exchange (docs/colocated.md).
//
// Listens on an abstract AF_UNIX socket under a fresh random name (abstract names live in the
// network namespace, never in the file system, and vanish with the socket). serve() answers
// connections with a segment's read-only descriptor and the session token
// (comm/colocate/handle_exchange.h), one per engine rank that maps the bucket, and returns when
// all were answered or the deadline passed. Only processes of the same uid get a descriptor: the
// server refuses (closes) a peer of another uid (SO_PEERCRED), each engine checks the token, and
// the kernel checks the peer on the engine's side.
// After handing a segment over, the server keeps that connection open: an engine holds its
// mapping of the segment between updates only while the connection it took the handle on stays
// open (comm/colocate/segment_mappings.h). The server closes it when the segment is destroyed
// (SharedSegment's destructor calls release_everywhere()), when the server is destroyed, and the
// kernel closes it when this process dies (hang-ups use shutdown(), so a forked child holding a
// copy of the socket does not keep it open); connections whose engine closed them are reaped at
// each hand-over and by held(), and at most kMaxHeld are kept (the oldest go first).
// Lifetime: one per trainer rank that sends colocated buckets; destruction closes the socket and
// every held connection.
// Threading: serve() from one thread at a time; name(), wake(), release() and
// release_everywhere() from any.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/colocate/segment.h"
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
  // Hands the segment to every peer that connects until `done()` is true (checked after each
  // peer, after each wake() and at least every 20 ms), for trainers that do not know how many
  // ranks of an engine will map the bucket. Returns how many took it. Throws comm::TimeoutError
  // when `deadline` passes first.
  int serve_until(const std::string& token, int segment_fd, std::size_t size,
                  const std::function<bool()>& done, Deadline deadline);
  // Makes a serve_until() in progress (or the next one) check done() at once. Any thread.
  void wake();

  // Closes the held connections of the engines that took segment `id`: they drop their mappings.
  void release(SegmentId id);
  // release(id) on every SegmentServer of this process.
  static void release_everywhere(SegmentId id);
  // Connections held open (engines that may keep a mapping), after reaping closed ones.
  std::size_t held();

  static constexpr std::size_t kMaxHeld = 256;

 private:
  struct Held {
    int connection = -1;
    SegmentId segment;
  };
  // Accepts one peer and hands it the segment; false when none connected within `wait` (or the
  // peer was refused).
  bool answer_one(const std::string& token, int segment_fd, std::size_t size, Millis wait);
  // Keeps `connection`, which took segment `id`; closes those its engines closed.
  void hold(int connection, SegmentId id);
  void reap_locked();

  std::string name_;
  int listener_ = -1;
  int wake_fd_ = -1;  // an eventfd: wake() writes it, the serving poll drains it
  std::mutex held_mu_;
  std::vector<Held> held_;  // oldest first
};

}  // namespace weightcast::comm::colocate

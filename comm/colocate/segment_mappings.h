// SegmentMappings: an engine's read-only mappings of trainer segments, kept between updates
// for as long as the trainer keeps the segment (docs/colocated.md, "Kept mappings").
//
// map() fetches the handle a request names, with the session's token, on every call (a kept
// mapping is no licence: the token and the uid are checked each time), and returns a mapping of
// that memory: the one kept from an earlier bucket when the descriptor is the same memfd
// (SegmentId), else a fresh MappedSegment (sealed memfd, read-only, the announced size), kept
// together with the connection the handle came on. A fresh mapping copies with pread; once a
// copy out of it is done (done()), a background thread populates it 4 MiB at a time, and only
// while no copy is in flight, so that later updates copy out of the mapping with memcpy (2-3x
// faster here: no page-cache lookup per 4 KiB page) and none pays page faults, or waits on them.
// A kept mapping is dropped when the trainer closes that connection (it destroyed the segment or
// its SegmentServer, or it died and the kernel closed it: segment_server.h), when more than
// max_segments are kept (the least recently used goes first), and at destruction; a copy in
// progress keeps its mapping alive until it ends (shared_ptr). So an engine holds a trainer's
// memory no longer than the trainer does, plus the background thread's reaction time.
// With keep = false every map() returns a fresh mapping, dropped after use.
// Threading: thread-safe. One background thread, started with the first kept mapping, watches
// the kept connections and populates; it alone closes kept connections (so a descriptor number
// it polls is never reused under it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/colocate/segment.h"

namespace weightcast::comm::colocate {

struct SegmentMappingsOptions {
  bool keep = true;              // keep mappings between updates (else map per bucket)
  std::size_t max_segments = 8;  // kept at most; the least recently used is dropped first
};

struct SegmentMappingsStats {
  std::size_t kept = 0;         // mappings kept now
  std::uint64_t hits = 0;       // map() calls served by a kept mapping
  std::uint64_t misses = 0;     // map() calls that mapped a segment afresh
  std::uint64_t dropped = 0;    // kept mappings dropped (connection closed, or over the cap)
  std::uint64_t populated = 0;  // mappings populated by the background thread
};

class SegmentMappings {
 public:
  explicit SegmentMappings(SegmentMappingsOptions options = {});
  ~SegmentMappings();
  SegmentMappings(const SegmentMappings&) = delete;
  SegmentMappings& operator=(const SegmentMappings&) = delete;

  // Fetches the handle served on the abstract socket `name` with `token` (fetch_and_hold) and
  // returns a mapping of its segment of `expected_size` bytes. Throws comm::TimeoutError when the
  // trainer does not hand it over within `timeout`, comm::Error for a refused handle (foreign
  // token or uid), a size other than `expected_size`, or a descriptor that is not a read-only
  // size-sealed memfd.
  std::shared_ptr<const MappedSegment> map(const std::string& name, const std::string& token,
                                           std::size_t expected_size,
                                           std::chrono::milliseconds timeout);
  // A copy out of `mapping` (from map()) is over, whether it succeeded or not: call it once per
  // map(). The background thread may populate the mapping while no copy is in flight.
  void done(const MappedSegment& mapping);

  SegmentMappingsStats stats() const;

 private:
  struct Entry {
    SegmentId id;
    std::shared_ptr<MappedSegment> mapping;
    int connection = -1;
    std::uint64_t last_use = 0;
    bool populate = false;  // done() asked for it
  };

  void run();
  // One round of the thread: close dropped connections, wait for hang-ups or a wake, drop the
  // hung-up, populate one piece when no copy is in flight. Throws comm::Error on a failed poll.
  void watch_once();
  void wake();
  // The next mapping done() asked to populate, or null.
  std::shared_ptr<MappedSegment> next_to_populate_locked();

  const SegmentMappingsOptions options_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<int> closing_;  // connections of dropped entries, closed by the thread
  std::uint64_t clock_ = 0;
  std::size_t in_flight_ = 0;  // map() calls not yet done()
  SegmentMappingsStats counts_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // started by map() under mu_
};

}  // namespace weightcast::comm::colocate

#include "comm/colocate/segment_mappings.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "comm/colocate/handle_exchange.h"
#include "comm/errors.h"

namespace weightcast::comm::colocate {

SegmentMappings::SegmentMappings(SegmentMappingsOptions options) : options_(options) {
  if (!options_.keep) return;  // nothing to watch
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    throw Error("segment mappings: eventfd(): " + std::string(std::strerror(errno)));
  }
  thread_ = std::thread([this] { run(); });
}

SegmentMappings::~SegmentMappings() {
  if (thread_.joinable()) {
    stop_.store(true);
    wake();
    thread_.join();
  }
  for (const Entry& e : entries_) ::close(e.connection);
  for (const int fd : closing_) ::close(fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void SegmentMappings::wake() {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

std::shared_ptr<const MappedSegment> SegmentMappings::map(const std::string& name,
                                                          const std::string& token,
                                                          std::size_t expected_size,
                                                          std::chrono::milliseconds timeout) {
  const HeldHandle held = fetch_and_hold(name, token, timeout);
  int fd = held.handle.fd;
  int connection = held.connection;
  const auto close_both = [&] {
    if (fd >= 0) ::close(fd);
    if (connection >= 0) ::close(connection);
  };
  if (held.handle.size != expected_size) {
    close_both();
    throw Error("segment.size: the request says " + std::to_string(expected_size) +
                " bytes, the trainer's handle " + std::to_string(held.handle.size));
  }
  SegmentId id;
  try {
    id = segment_id(fd);
  } catch (...) {
    close_both();
    throw;
  }
  if (options_.keep) {
    std::lock_guard lock(mu_);
    for (Entry& e : entries_) {
      if (e.id == id && e.mapping->size() == expected_size) {
        e.last_use = ++clock_;
        ++counts_.hits;
        ++in_flight_;
        close_both();  // the same memory, kept with the first connection
        return e.mapping;
      }
    }
  }
  std::shared_ptr<MappedSegment> mapping;
  try {
    mapping = std::make_shared<MappedSegment>(fd, expected_size);  // takes the descriptor
    fd = -1;
  } catch (...) {
    fd = -1;  // the constructor closed it
    close_both();
    throw;
  }
  if (!options_.keep) {
    close_both();
    return mapping;
  }
  {
    std::lock_guard lock(mu_);
    ++counts_.misses;
    ++in_flight_;
    entries_.push_back({id, mapping, connection, ++clock_, false});
    connection = -1;  // kept: the thread closes it
    while (entries_.size() > options_.max_segments) {
      auto oldest =
          std::min_element(entries_.begin(), entries_.end(),
                           [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
      closing_.push_back(oldest->connection);
      entries_.erase(oldest);
      ++counts_.dropped;
    }
  }
  wake();  // a new connection to watch
  return mapping;
}

void SegmentMappings::done(const MappedSegment& mapping) {
  if (!options_.keep) return;
  {
    std::lock_guard lock(mu_);
    if (in_flight_ > 0) --in_flight_;
    const auto it = std::find_if(entries_.begin(), entries_.end(),
                                 [&](const Entry& e) { return e.mapping.get() == &mapping; });
    if (it != entries_.end() && !mapping.populated()) it->populate = true;
  }
  wake();
}

std::shared_ptr<MappedSegment> SegmentMappings::next_to_populate_locked(bool& more) {
  std::shared_ptr<MappedSegment> next;
  more = false;
  for (Entry& e : entries_) {
    if (!e.populate || e.mapping->populated()) continue;
    if (next) {
      more = true;
      break;
    }
    next = e.mapping;
  }
  return next;
}

SegmentMappingsStats SegmentMappings::stats() const {
  std::lock_guard lock(mu_);
  SegmentMappingsStats out = counts_;
  out.kept = entries_.size();
  return out;
}

void SegmentMappings::run() {
  // Populating competes with the engine's own work for the CPU: let that go first.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  constexpr std::size_t kPiece = std::size_t{4} << 20;  // ~2 ms of page faults here
  std::vector<pollfd> fds;
  int wait_ms = 1000;  // bounded so that a missed wake costs at most a second
  while (!stop_.load()) {
    {
      std::lock_guard lock(mu_);
      for (const int fd : closing_) ::close(fd);
      closing_.clear();
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (const Entry& e : entries_) fds.push_back({e.connection, POLLIN | POLLRDHUP, 0});
    }
    const int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      std::uint64_t wakes = 0;
      (void)!::read(wake_fd_, &wakes, sizeof(wakes));
    }
    std::shared_ptr<MappedSegment> next;
    {
      std::lock_guard lock(mu_);
      // A trainer never writes after the handle: a readable or hung-up connection is closed.
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const auto it = std::find_if(entries_.begin(), entries_.end(),
                                     [&](const Entry& e) { return e.connection == fds[i].fd; });
        if (it == entries_.end()) continue;  // already dropped (over the cap)
        closing_.push_back(it->connection);
        entries_.erase(it);
        ++counts_.dropped;
      }
      bool more = false;
      next = next_to_populate_locked(more);
      // One piece at a time, and none while a copy is in flight: a copy never waits on faults.
      wait_ms = !next ? 1000 : in_flight_ > 0 ? 5 : 0;
      if (in_flight_ > 0) next.reset();
    }
    if (!next) continue;
    try {
      if (next->populate(kPiece) == next->size()) {
        std::lock_guard lock(mu_);
        ++counts_.populated;
      }
    } catch (const Error&) {
      // The mapping stays on pread: slower, still correct.
      std::lock_guard lock(mu_);
      for (Entry& e : entries_) {
        if (e.mapping == next) e.populate = false;
      }
    }
  }
}

}  // namespace weightcast::comm::colocate

#include "comm/colocate/segment_mappings.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "comm/colocate/handle_exchange.h"
#include "comm/errors.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm::colocate {

SegmentMappings::SegmentMappings(SegmentMappingsOptions options) : options_(options) {
  if (!options_.keep) return;  // nothing to watch
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    throw Error("segment mappings: eventfd(): " + std::string(std::strerror(errno)));
  }
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
  net::Fd fd(held.handle.fd);
  net::Fd connection(held.connection);
  if (held.handle.size != expected_size) {
    throw Error("segment.size: the request says " + std::to_string(expected_size) +
                " bytes, the trainer's handle " + std::to_string(held.handle.size));
  }
  const SegmentId id = segment_id(fd.get());
  // The kept mapping of this memory, counted in flight; null when there is none.
  const auto kept_locked = [&]() -> std::shared_ptr<MappedSegment> {
    for (Entry& e : entries_) {
      if (e.id != id || e.mapping->size() != expected_size) continue;
      e.last_use = ++clock_;
      ++counts_.hits;
      ++in_flight_;
      return e.mapping;  // kept with its first connection; this one closes
    }
    return nullptr;
  };
  if (options_.keep) {
    std::lock_guard lock(mu_);
    if (auto kept = kept_locked()) return kept;
  }
  // Checks the descriptor and takes it (the constructor closes it when it throws).
  MappedSegment checked(fd.release(), expected_size);
  auto mapping = std::make_shared<MappedSegment>(std::move(checked));
  if (!options_.keep) return mapping;
  {
    std::lock_guard lock(mu_);
    // Another rank of this engine may have mapped the same segment meanwhile: keep one.
    if (auto kept = kept_locked()) return kept;
    entries_.push_back({id, mapping, connection.get(), ++clock_, false});
    connection.release();  // kept: the thread closes it
    // The thread starts with the first kept mapping: an engine never sent colocated buckets
    // runs none.
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    ++counts_.misses;
    ++in_flight_;
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

std::shared_ptr<MappedSegment> SegmentMappings::next_to_populate_locked() {
  for (Entry& e : entries_) {
    if (e.populate && !e.mapping->populated()) return e.mapping;
  }
  return nullptr;
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
  while (!stop_.load()) {
    try {
      watch_once();
    } catch (...) {
      // Nothing here may end the engine; try again shortly (drops and populating resume).
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void SegmentMappings::watch_once() {
  constexpr std::size_t kPiece = std::size_t{4} << 20;  // ~2 ms of page faults here
  std::vector<pollfd> fds;
  bool populate_now = false;
  {
    std::lock_guard lock(mu_);
    for (const int fd : closing_) {
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
    }
    closing_.clear();
    fds.push_back(pollfd{wake_fd_, POLLIN, 0});
    for (const Entry& e : entries_) fds.push_back({e.connection, POLLIN | POLLRDHUP, 0});
    populate_now = in_flight_ == 0 && next_to_populate_locked() != nullptr;
  }
  // done() and map() wake it; bounded so that a missed wake costs at most a second.
  const int ready = ::poll(fds.data(), fds.size(), populate_now ? 0 : 1000);
  if (ready < 0) {
    if (errno == EINTR) return;
    throw Error("segment mappings: poll(): " + std::string(std::strerror(errno)));
  }
  if ((fds[0].revents & POLLIN) != 0) {
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
    // One piece at a time, and none while a copy is in flight: a copy that starts meanwhile
    // waits for one piece at most.
    if (in_flight_ == 0) next = next_to_populate_locked();
  }
  if (!next) return;
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

}  // namespace weightcast::comm::colocate

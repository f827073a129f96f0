#include "comm/gloo/gloo_watchdog.h"

#include "comm/gloo/gloo_errors.h"

namespace weightcast::comm::gloo_backend {

void FailedPeers::record(int rank, const std::string& why) {
  std::lock_guard lock(mu_);
  failed_.emplace(rank, why);
}

std::optional<std::string> FailedPeers::lookup(int rank) const {
  std::lock_guard lock(mu_);
  auto it = failed_.find(rank);
  if (it == failed_.end()) return std::nullopt;
  return it->second;
}

int FailedPeers::any() const {
  std::lock_guard lock(mu_);
  return failed_.empty() ? -1 : failed_.begin()->first;
}

int FailedPeers::first_of(const std::vector<int>& suspects) const {
  {
    std::lock_guard lock(mu_);
    for (int r : suspects) {
      if (failed_.count(r) != 0) return r;
    }
  }
  return any();
}

PeerWatch::PeerWatch(::gloo::Context& context, FailedPeers& failed, std::function<void()> nudge,
                     Millis interval)
    : failed_(failed), nudge_(std::move(nudge)), interval_(interval) {
  // A slot of our own, drawn in the same order on every rank, so no collective ever sends to it.
  const auto slot = static_cast<std::uint64_t>(context.nextSlot());
  bytes_.resize(static_cast<std::size_t>(context.size));
  for (int r = 0; r < context.size; ++r) {
    if (r == context.rank) continue;
    auto buf = context.createUnboundBuffer(&bytes_[static_cast<std::size_t>(r)], 1);
    bool gone = false;
    try {
      buf->recv(r, slot, 0, 1);
    } catch (const std::exception& e) {
      // The peer already closed (it may have finished with the group); collectives that need it
      // will find out.
      gone = true;
      failed_.record(r, e.what());
    }
    sentinels_.push_back({r, gone, std::move(buf)});
  }
  if (!sentinels_.empty()) thread_ = std::thread([this] { run(); });
}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::begin() {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    active_ = true;
    wake = idle_;
  }
  // Only a thread idle since the last collective needs waking: one between probes probes again
  // on time. Back-to-back collectives would otherwise wake it, a context switch each, on the
  // cores their copies run on.
  if (wake) cv_.notify_all();
}

void PeerWatch::end() {
  std::lock_guard lock(mu_);
  active_ = false;
}

void PeerWatch::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!active_) {
      idle_ = true;
      cv_.wait(lock, [&] { return stop_ || active_; });
      idle_ = false;
      continue;
    }
    lock.unlock();
    probe_all();
    lock.lock();
    cv_.wait_for(lock, interval_, [&] { return stop_; });
  }
}

void PeerWatch::probe_all() {
  std::unique_lock probe_lock(probe_mu_);
  bool news = false;
  for (auto& s : sentinels_) {
    if (s.failed) continue;
    // Pre-set the abort flag so the zero-timeout wait returns at once instead of timing out: a
    // Gloo wait that times out tears the whole context down. It throws only if the pair failed.
    s.buf->abortWaitRecv();
    try {
      s.buf->waitRecv(nullptr, Millis(0));
    } catch (const std::exception& e) {
      s.failed = true;
      // Our own teardown (abort, a local timeout) fails every pair too; that is not news.
      if (!is_local_teardown(e.what())) {
        failed_.record(s.rank, e.what());
        news = true;
      }
    }
  }
  probe_lock.unlock();
  if (news) nudge_();
}

}  // namespace weightcast::comm::gloo_backend

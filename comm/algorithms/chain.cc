#include "comm/algorithms/chain.h"

#include <algorithm>

#include "comm/errors.h"

namespace weightcast::comm::gloo_backend {

::gloo::transport::UnboundBuffer& ChunkWindow::open(std::size_t index, void* ptr, std::size_t len) {
  auto buf = context_.createUnboundBuffer(ptr, len);
  std::lock_guard lock(mu_);
  if (woken_) {
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
  auto [it, inserted] = live_.emplace(index, std::move(buf));
  WC_ENFORCE(inserted, "chunk ", index, " opened twice");
  return *it->second;
}

::gloo::transport::UnboundBuffer& ChunkWindow::at(std::size_t index) {
  std::lock_guard lock(mu_);
  auto it = live_.find(index);
  WC_ENFORCE(it != live_.end(), "chunk ", index, " is not open");
  return *it->second;
}

void ChunkWindow::close(std::size_t index) {
  std::unique_ptr<::gloo::transport::UnboundBuffer> doomed;
  std::lock_guard lock(mu_);
  auto it = live_.find(index);
  if (it == live_.end()) return;
  doomed = std::move(it->second);
  live_.erase(it);
}

void ChunkWindow::clear() {
  std::lock_guard lock(mu_);
  live_.clear();
  woken_ = false;
}

void ChunkWindow::wake_all() {
  std::lock_guard lock(mu_);
  woken_ = true;
  for (auto& [index, buf] : live_) {
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
}

void ChunkWindow::nudge_all() {
  std::lock_guard lock(mu_);
  for (auto& [index, buf] : live_) {
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
}

bool ChunkWindow::woken() const {
  std::lock_guard lock(mu_);
  return woken_;
}

namespace {

enum class Dir { kRecv, kSend };

class Chain {
 public:
  Chain(::gloo::Context& context, ChunkWindow& window, const FailedPeers& failed,
        const ChainArgs& args)
      : window_(window), failed_(failed), a_(args) {
    const int n = context.size;
    const int pos = (context.rank - args.root + n) % n;
    pred_ = pos > 0 ? (context.rank - 1 + n) % n : -1;
    succ_ = pos < n - 1 ? (context.rank + 1) % n : -1;
    chunks_ = (args.bytes + args.chunk_bytes - 1) / args.chunk_bytes;
    window_size_ = static_cast<std::size_t>(args.in_flight);
  }

  void run() {
    std::size_t posted = 0;      // recvs posted so far (chunks [0, posted))
    std::size_t sends_done = 0;  // sends completed so far (chunks [0, sends_done))
    for (std::size_t i = 0; i < chunks_; ++i) {
      if (pred_ >= 0) {
        for (; posted < chunks_ && posted < i + window_size_; ++posted) {
          auto& buf = open(posted);
          call(posted, Dir::kRecv, [&] { buf.recv(pred_, a_.slot, 0, buf.size); });
        }
        wait(i, Dir::kRecv);
      }
      if (succ_ < 0) {
        window_.close(i);
        continue;
      }
      for (; i - sends_done >= window_size_; ++sends_done) finish_send(sends_done);
      auto& buf = pred_ >= 0 ? window_.at(i) : open(i);
      call(i, Dir::kSend, [&] { buf.send(succ_, a_.slot, 0, buf.size); });
    }
    if (succ_ >= 0) {
      for (; sends_done < chunks_; ++sends_done) finish_send(sends_done);
    }
  }

 private:
  ::gloo::transport::UnboundBuffer& open(std::size_t i) {
    const std::size_t offset = i * a_.chunk_bytes;
    const std::size_t len = std::min(a_.chunk_bytes, a_.bytes - offset);
    return window_.open(i, a_.data + offset, len);
  }

  void finish_send(std::size_t i) {
    wait(i, Dir::kSend);
    window_.close(i);
  }

  std::string doing(std::size_t i, Dir dir) const {
    return detail::concat(dir == Dir::kRecv ? "receiving" : "sending", " chunk ", i + 1, "/",
                          chunks_, dir == Dir::kRecv ? " from rank " : " to rank ",
                          dir == Dir::kRecv ? pred_ : succ_);
  }

  template <typename Fn>
  void call(std::size_t i, Dir dir, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      throw LinkFailure{dir == Dir::kRecv ? pred_ : succ_, doing(i, dir), e.what()};
    }
  }

  // Waits with what is left of the collective's deadline. A false return is a wake-up: abort
  // (wake_all) ends the collective, a nudge makes the loop look at FailedPeers again.
  void wait(std::size_t i, Dir dir) {
    auto& buf = window_.at(i);
    const int peer = dir == Dir::kRecv ? pred_ : succ_;
    while (true) {
      if (window_.woken()) throw WaitInterrupted{};
      if (auto why = failed_.lookup(peer)) {
        if (settle(buf, i, dir, *why)) return;
        continue;
      }
      bool done = false;
      call(i, dir, [&] {
        const Millis left = remaining(a_.deadline);
        done = dir == Dir::kRecv ? buf.waitRecv(nullptr, left) : buf.waitSend(nullptr, left);
      });
      if (done) return;
    }
  }

  // The connection to the chunk's peer is gone, so its state is final: Gloo completed every
  // operation it could before it noticed the connection fail. Done means done; otherwise the
  // chunk can never arrive (or leave), and the zero-timeout wait throws. A false return is a
  // leftover wake-up flag; the caller looks again.
  bool settle(::gloo::transport::UnboundBuffer& buf, std::size_t i, Dir dir,
              const std::string& why) {
    try {
      return dir == Dir::kRecv ? buf.waitRecv(nullptr, Millis(0))
                               : buf.waitSend(nullptr, Millis(0));
    } catch (const std::exception&) {
      const int peer = dir == Dir::kRecv ? pred_ : succ_;
      throw LinkFailure{peer, doing(i, dir), why, true};
    }
  }

  ChunkWindow& window_;
  const FailedPeers& failed_;
  const ChainArgs& a_;
  int pred_ = -1;
  int succ_ = -1;
  std::size_t chunks_ = 0;
  std::size_t window_size_ = 1;
};

}  // namespace

void chain_broadcast(::gloo::Context& context, ChunkWindow& window, const FailedPeers& failed,
                     const ChainArgs& args) {
  if (args.bytes == 0 || context.size == 1) return;
  WC_ENFORCE_GT(args.chunk_bytes, std::size_t{0});
  WC_ENFORCE_GT(args.in_flight, 0);
  Chain(context, window, failed, args).run();
}

}  // namespace weightcast::comm::gloo_backend

// FakeSource: group rank 0 for in-process engine tests, without sockets. broadcast() queues one
// bucket's bytes for every engine rank; each FakeChannel's receive() takes the next one (with
// its timeout), copies it and checks the size as a real broadcast would. connector() plugs it
// into EngineOptions. A hook may run before each receive (to hold a rank at a point).
// Threading: all methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/errors.h"
#include "sync/engine/receive/channel.h"

namespace weightcast::sync::engine::testing {

class FakeSource : public std::enable_shared_from_this<FakeSource> {
 public:
  // Called with (engine rank, index of the receive on that rank) before each receive.
  using Hook = std::function<void(int rank, int index)>;

  void broadcast(std::vector<std::byte> bytes) {
    {
      std::lock_guard lock(mu_);
      for (auto& q : queues_) q.push_back(bytes);
    }
    cv_.notify_all();
  }

  void set_hook(Hook hook) {
    std::lock_guard lock(mu_);
    hook_ = std::move(hook);
  }

  int connects() const {
    std::lock_guard lock(mu_);
    return connects_;
  }

  // Drops every queued broadcast (the sender of a refused request never sends).
  void clear() {
    std::lock_guard lock(mu_);
    for (auto& q : queues_) q.clear();
  }

  GroupSpec last_spec() const {
    std::lock_guard lock(mu_);
    return last_spec_;
  }

  // Channels for `ranks` engine ranks reading from this source. Queued data is dropped.
  std::vector<std::unique_ptr<BucketChannel>> make_channels(int ranks, int first_group_rank = 1);

  GroupConnector connector() {
    auto self = shared_from_this();
    return [self](const GroupSpec& spec, const ConnectOptions& opts) {
      {
        std::lock_guard lock(self->mu_);
        self->connects_ += 1;
        self->last_spec_ = spec;
      }
      return self->make_channels(opts.rank_count, spec.rank_offset);
    };
  }

 private:
  friend class FakeChannel;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::vector<std::byte>>> queues_;
  std::uint64_t generation_ = 0;
  Hook hook_;
  int connects_ = 0;
  GroupSpec last_spec_;
};

class FakeChannel final : public BucketChannel {
 public:
  FakeChannel(std::shared_ptr<FakeSource> source, int rank, int group_rank,
              std::uint64_t generation)
      : source_(std::move(source)), rank_(rank), group_rank_(group_rank), generation_(generation) {}

  void receive(void* buffer, std::size_t bytes, comm::Millis timeout,
               const comm::ReceivedFn& on_received) override {
    FakeSource::Hook hook;
    {
      std::lock_guard lock(source_->mu_);
      hook = source_->hook_;
    }
    if (hook) hook(rank_, index_);
    index_ += 1;
    std::unique_lock lock(source_->mu_);
    auto& q = source_->queues_[static_cast<std::size_t>(rank_)];
    const bool ready = source_->cv_.wait_for(lock, timeout, [&] {
      return aborted_ || source_->generation_ != generation_ || !q.empty();
    });
    if (aborted_ || source_->generation_ != generation_) {
      throw comm::PeerError("fake source", "channel aborted");
    }
    if (!ready) throw comm::TimeoutError("fake broadcast timed out");
    auto data = std::move(q.front());
    q.pop_front();
    if (data.size() != bytes) {
      throw comm::PeerError("fake source", "broadcast of " + std::to_string(data.size()) +
                                               " bytes, expected " + std::to_string(bytes));
    }
    if (bytes) std::memcpy(buffer, data.data(), bytes);
    if (on_received && bytes > 0) on_received(0, bytes);
  }

  void abort() override {
    {
      std::lock_guard lock(source_->mu_);
      aborted_ = true;
    }
    source_->cv_.notify_all();
  }

  comm::MemoryKind memory() const override { return comm::MemoryKind::kHost; }
  int group_rank() const override { return group_rank_; }
  std::string data_path() const override { return "fake"; }

 private:
  std::shared_ptr<FakeSource> source_;
  const int rank_;
  const int group_rank_;
  const std::uint64_t generation_;
  int index_ = 0;
  bool aborted_ = false;  // guarded by source_->mu_
};

inline std::vector<std::unique_ptr<BucketChannel>> FakeSource::make_channels(int ranks,
                                                                             int first_group_rank) {
  std::uint64_t generation;
  {
    std::lock_guard lock(mu_);
    generation_ += 1;
    generation = generation_;
    queues_.assign(static_cast<std::size_t>(ranks), {});
  }
  cv_.notify_all();
  std::vector<std::unique_ptr<BucketChannel>> out;
  for (int r = 0; r < ranks; ++r) {
    out.push_back(
        std::make_unique<FakeChannel>(shared_from_this(), r, first_group_rank + r, generation));
  }
  return out;
}

}  // namespace weightcast::sync::engine::testing

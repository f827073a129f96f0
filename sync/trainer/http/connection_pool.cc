#include "sync/trainer/http/connection_pool.h"

#include <httplib.h>

#include <utility>

namespace weightcast::sync::trainer {

ConnectionPool::ConnectionPool(std::string url, std::chrono::milliseconds max_idle)
    : url_(std::move(url)), max_idle_(max_idle) {}

ConnectionPool::~ConnectionPool() = default;

ConnectionPool::Lease::Lease(ConnectionPool* pool, std::unique_ptr<httplib::Client> client,
                             bool reused)
    : pool_(pool), client_(std::move(client)), reused_(reused) {}

ConnectionPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      client_(std::move(other.client_)),
      reused_(other.reused_),
      keep_(other.keep_) {}

ConnectionPool::Lease::~Lease() {
  if (pool_ != nullptr && keep_ && client_ != nullptr) pool_->give_back(std::move(client_));
}

ConnectionPool::Lease ConnectionPool::acquire() {
  std::vector<Idle> stale;  // closed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty() && Clock::now() - idle_.back().since <= max_idle_) {
      ++reuses_;
      // Idle entries are ordered by return time: the ones below are older, and go once past
      // max_idle on a later acquire.
      Idle last = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(last.client), true);
    }
    stale.swap(idle_);  // the most recent is past max_idle: all of them are
  }
  auto client = std::make_unique<httplib::Client>(url_);
  client->set_keep_alive(max_idle_.count() > 0);
  client->set_tcp_nodelay(true);
  return Lease(this, std::move(client), false);
}

void ConnectionPool::give_back(std::unique_ptr<httplib::Client> client) {
  if (max_idle_.count() == 0) return;  // closed here
  std::unique_ptr<httplib::Client> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() >= kMaxIdle) {
    dropped = std::move(idle_.front().client);
    idle_.erase(idle_.begin());
  }
  idle_.push_back({std::move(client), Clock::now()});
}

void ConnectionPool::close_idle() {
  std::vector<Idle> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing.swap(idle_);
  }
}

std::size_t ConnectionPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_.size();
}

std::size_t ConnectionPool::reuses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reuses_;
}

}  // namespace weightcast::sync::trainer

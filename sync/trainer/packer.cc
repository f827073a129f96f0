#include "sync/trainer/packer.h"

#include <algorithm>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

BucketPacker::BucketPacker(const std::vector<BucketPlan>& plans, TensorSource source,
                           std::size_t buffers)
    : plans_(plans), source_(std::move(source)) {
  WC_ENFORCE_GE(buffers, std::size_t{1});
  const std::size_t count = std::min(buffers, plans.size());
  const std::size_t bytes = max_total_bytes(plans);
  // Default-initialized: pack() writes every byte of a bucket, padding included.
  for (std::size_t i = 0; i < count; ++i) buffers_.emplace_back(new std::byte[bytes]);
  thread_ = std::thread([this] { run(); });
}

BucketPacker::~BucketPacker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BucketPacker::run() {
  const std::uint64_t ring = buffers_.size();
  for (std::uint64_t k = 0; k < plans_.size(); ++k) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || k < released_ + ring; });
      if (stop_) return;
    }
    try {
      const BucketPlan& plan = plans_[k];
      pack(plan, source_, std::span<std::byte>(buffers_[k % ring].get(), plan.total_bytes));
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      packed_ = k + 1;
    }
    cv_.notify_all();
  }
}

std::span<std::byte> BucketPacker::acquire(std::uint64_t k, comm::Deadline deadline) {
  std::unique_lock lock(mu_);
  WC_ENFORCE_EQ(k, acquired_, "buckets are acquired in order");
  WC_ENFORCE_LT(k, static_cast<std::uint64_t>(plans_.size()));
  WC_ENFORCE_LT(k - released_, static_cast<std::uint64_t>(buffers_.size()),
                "release a bucket before acquiring more than the ring holds");
  cv_.wait_until(lock, deadline, [&] { return packed_ > k || error_ != nullptr; });
  if (packed_ <= k) {
    if (error_) std::rethrow_exception(error_);
    throw comm::TimeoutError("bucket " + std::to_string(k) + " was not packed in time");
  }
  ++acquired_;
  return {buffers_[k % buffers_.size()].get(), plans_[k].total_bytes};
}

void BucketPacker::release(std::uint64_t k) {
  {
    std::lock_guard lock(mu_);
    WC_ENFORCE_EQ(k, released_, "buckets are released in order");
    WC_ENFORCE_LT(k, acquired_, "release of a bucket never acquired");
    released_ = k + 1;
  }
  cv_.notify_all();
}

}  // namespace weightcast::sync::trainer

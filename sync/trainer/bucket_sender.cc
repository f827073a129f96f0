#include "sync/trainer/bucket_sender.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/packer.h"

namespace weightcast::sync::trainer {

namespace {

double seconds_since(comm::Clock::time_point start) {
  return std::chrono::duration<double>(comm::Clock::now() - start).count();
}

// A device buffer for the NCCL path, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) : ptr(bytes > 0 ? comm::cuda_alloc(bytes) : nullptr) {}
  ~DeviceBuffer() { comm::cuda_free(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

class Sender {
 public:
  Sender(const UpdateSession& session, const std::string& group, comm::Communicator& comm,
         std::span<EngineApi* const> engines, const BucketSendOptions& options)
      : session_(session), group_(group), comm_(comm), engines_(engines), options_(options) {}

  BucketSendResult run(std::span<const NamedTensor> tensors);

 private:
  struct InFlight {
    std::uint64_t bucket = 0;
    std::vector<std::future<void>> answers;  // one per engine
  };

  void issue(std::uint64_t k);
  // Collects the answers of the oldest bucket in flight, waiting until `deadline`.
  void collect_oldest(comm::Deadline deadline);
  void broadcast(const BucketPlan& plan, std::span<std::byte> bucket, comm::Deadline deadline);
  // Per-tensor format in host memory: each tensor from the caller's bytes, nothing packed.
  void broadcast_tensors(const BucketPlan& plan, comm::Deadline deadline);
  void broadcast_bytes(std::byte* data, std::size_t bytes, comm::Deadline deadline);
  // Marks the phase failed and aborts the communicator so a blocked broadcast returns.
  void fail();
  void record(EngineFailure failure);

  const UpdateSession& session_;
  const std::string& group_;
  comm::Communicator& comm_;
  std::span<EngineApi* const> engines_;
  const BucketSendOptions& options_;

  std::vector<BucketPlan> plans_;
  std::unordered_map<std::string, std::span<const std::byte>> bytes_of_;
  std::deque<InFlight> in_flight_;
  std::atomic<bool> failed_{false};
  std::mutex mu_;  // guards result_.failures against the request threads
  BucketSendResult result_;
  std::unique_ptr<DeviceBuffer> device_;
};

void Sender::fail() {
  failed_ = true;
  comm_.abort();
}

void Sender::record(EngineFailure failure) {
  std::lock_guard lock(mu_);
  result_.failures.push_back(std::move(failure));
}

void Sender::issue(std::uint64_t k) {
  const auto base = session_.bucket_request(plans_[k], group_, options_.load_format);
  InFlight flight{k, {}};
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    EngineApi* engine = engines_[e];
    auto request =
        std::make_shared<const UpdateWeightsFromDistributedRequest>(session_.for_engine(base, e));
    flight.answers.push_back(std::async(std::launch::async, [this, engine, request] {
      try {
        engine->update_weights_from_distributed(*request);
      } catch (...) {
        fail();
        throw;
      }
    }));
  }
  in_flight_.push_back(std::move(flight));
}

void Sender::collect_oldest(comm::Deadline deadline) {
  InFlight flight = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto start = comm::Clock::now();
  const std::string route = "POST /update_weights_from_distributed";
  for (std::size_t e = 0; e < flight.answers.size(); ++e) {
    auto& answer = flight.answers[e];
    if (answer.wait_until(deadline) != std::future_status::ready) {
      record(EngineFailure{engines_[e]->url(), route,
                           "bucket " + std::to_string(flight.bucket) +
                               " not answered before the data phase deadline",
                           false, true});
      fail();
      continue;  // the future's destructor waits for the call's own read timeout
    }
    try {
      answer.get();
    } catch (...) {
      record(current_failure(engines_[e]->url(), route));
    }
  }
  result_.http_wait_seconds += seconds_since(start);
}

void Sender::broadcast(const BucketPlan& plan, std::span<std::byte> bucket,
                       comm::Deadline deadline) {
  std::byte* data = bucket.data();
  if (options_.memory == comm::MemoryKind::kCuda) {
    comm::cuda_copy_to_device(device_->ptr, bucket.data(), bucket.size());
    data = static_cast<std::byte*>(device_->ptr);
  }
  const auto start = comm::Clock::now();
  if (options_.load_format == LoadFormat::kPerTensor) {
    // One collective per tensor, as a torch trainer's dist.broadcast per tensor.
    for (const BucketEntry& entry : plan.entries) {
      broadcast_bytes(data + entry.offset, entry.bytes, deadline);
    }
  } else {
    broadcast_bytes(data, bucket.size(), deadline);
  }
  result_.broadcast_seconds += seconds_since(start);
}

void Sender::broadcast_tensors(const BucketPlan& plan, comm::Deadline deadline) {
  const auto start = comm::Clock::now();
  for (const BucketEntry& entry : plan.entries) {
    const auto bytes = bytes_of_.at(entry.meta.name);
    // The root only reads its buffer.
    broadcast_bytes(const_cast<std::byte*>(bytes.data()), bytes.size(), deadline);
  }
  result_.broadcast_seconds += seconds_since(start);
}

void Sender::broadcast_bytes(std::byte* data, std::size_t bytes, comm::Deadline deadline) {
  comm::BroadcastOptions opts;
  opts.buffer = data;
  opts.bytes = bytes;
  opts.root = 0;
  opts.timeout = std::max(comm::Millis(1), comm::remaining(deadline));
  opts.memory = options_.memory;
  comm_.broadcast(opts);
}

BucketSendResult Sender::run(std::span<const NamedTensor> tensors) {
  const auto start = comm::Clock::now();
  const comm::Deadline deadline = start + options_.timeout;
  WC_ENFORCE_GE(options_.max_in_flight, std::size_t{1});

  auto& bytes_of = bytes_of_;
  std::vector<TensorMeta> metas;
  for (const auto& t : tensors) {
    WC_ENFORCE_EQ(t.bytes.size(), t.meta.byte_count(), "bytes of tensor ", t.meta.name);
    WC_ENFORCE(bytes_of.emplace(t.meta.name, t.bytes).second, "duplicate tensor ", t.meta.name);
    metas.push_back(t.meta);
    result_.bytes += t.bytes.size();
  }
  result_.tensors = metas.size();
  const std::size_t alignment = options_.load_format == LoadFormat::kWeightcastBucket
                                    ? kDefaultBucketAlignment
                                    : std::size_t{1};
  plans_ = plan_buckets(metas, options_.bucket_bytes, alignment);
  if (options_.memory == comm::MemoryKind::kCuda) {
    device_ = std::make_unique<DeviceBuffer>(max_total_bytes(plans_));
  }
  const auto n = static_cast<std::uint64_t>(plans_.size());

  {
    const bool unpacked = options_.load_format == LoadFormat::kPerTensor &&
                          options_.memory == comm::MemoryKind::kHost;
    // Nothing to pack at all for unpacked sends: an empty plan list keeps the packer idle.
    const std::vector<BucketPlan> none;
    BucketPacker packer(
        unpacked ? none : plans_, [&](const BucketEntry& e) { return bytes_of.at(e.meta.name); }, 2,
        options_.pack_buffers);
    std::uint64_t next = 0;  // next bucket whose request is not sent yet
    for (std::uint64_t k = 0; k < n && !failed_; ++k) {
      try {
        // Requests k (required) and k+1 (look-ahead) go out before bucket k is broadcast. The
        // in-flight bound may wait for older answers, never for bucket k's own: that answer
        // needs the broadcast below.
        while (next <= std::min(k + 1, n - 1) && !failed_) {
          while (in_flight_.size() >= options_.max_in_flight && in_flight_.front().bucket < k) {
            collect_oldest(deadline);
          }
          // A failure seen while collecting ends the phase here: one more request would reach a
          // silent engine too, and its answer is awaited for a whole read timeout.
          if (failed_ || in_flight_.size() >= options_.max_in_flight) break;
          issue(next++);
        }
        if (failed_) break;
        if (unpacked) {
          broadcast_tensors(plans_[k], deadline);
        } else {
          const auto pack_start = comm::Clock::now();
          std::span<std::byte> bucket = packer.acquire(k, deadline);
          result_.pack_wait_seconds += seconds_since(pack_start);
          if (failed_) break;
          broadcast(plans_[k], bucket, deadline);
          packer.release(k);
        }
        ++result_.buckets;
        if (options_.bucket_delay.count() > 0) std::this_thread::sleep_for(options_.bucket_delay);
      } catch (const comm::EnforceError&) {
        fail();
        throw;
      } catch (const std::exception& e) {
        if (result_.error.empty()) {
          result_.error = "bucket " + std::to_string(k) + " on group " + group_ + ": " + e.what();
        }
        fail();
      }
    }
  }
  const comm::Deadline last =
      failed_ ? std::min(deadline, comm::Clock::now() + options_.failure_grace) : deadline;
  while (!in_flight_.empty()) collect_oldest(last);

  result_.ok = !failed_ && result_.failures.empty() && result_.error.empty();
  result_.seconds = seconds_since(start);
  return std::move(result_);
}

}  // namespace

BucketSendResult send_buckets(const UpdateSession& session, const std::string& group_name,
                              comm::Communicator& comm, std::span<EngineApi* const> engines,
                              std::span<const NamedTensor> tensors,
                              const BucketSendOptions& options) {
  Sender sender(session, group_name, comm, engines, options);
  return sender.run(tensors);
}

}  // namespace weightcast::sync::trainer

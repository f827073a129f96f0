#include "sync/trainer/colocated_sender.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/model/checksum.h"
#include "sync/protocol/protocol_text.h"
#include "sync/trainer/engine_calls.h"

namespace weightcast::sync::trainer {

namespace {

using comm::seconds_since;

constexpr std::size_t kChunk = 256 * 1024;  // copied, then hashed while in cache
const std::string kRoute = "POST /update_weights_from_tensor";

constexpr auto kModes = comm::enum_names<ColocateMode>(
    "colocate mode",
    {{ColocateMode::kOff, "off"}, {ColocateMode::kOn, "on"}, {ColocateMode::kAuto, "auto"}});

}  // namespace

std::string_view to_string(ColocateMode mode) {
  return kModes.name(mode);
}

ColocateMode parse_colocate_mode(std::string_view text) {
  return parse_name<comm::ConfigError>(kModes, text);
}

// One send(): the plan, the packer thread and the buckets' delivery.
class ColocatedSend {
 public:
  ColocatedSend(ColocatedSender& owner, const UpdateSession& session,
                std::span<const ColocatedEngine> engines, const BucketSendOptions& options)
      : owner_(owner), session_(session), engines_(engines), options_(options) {}

  BucketSendResult run(std::span<const NamedTensor> tensors);

 private:
  // Per bucket, written by the packer: where its tensors lie (a segment and their offsets in it)
  // and their digests.
  struct Laid {
    int fd = -1;  // the segment's read-only descriptor
    std::size_t size = 0;
    std::string cuda_ipc;  // kCuda: the device segment's handle (hex), instead of fd
    std::vector<std::uint64_t> offsets;
    std::vector<std::string> digests;
  };

  void plan(std::span<const NamedTensor> tensors);
  // The packer thread: bucket k into segment k % 2 once bucket k - 2 was answered.
  void pack_all();
  // Bucket k's tensors where they are, when all lie in one segment already (a shared
  // TensorArena); else nullopt.
  std::optional<Laid> in_place(std::uint64_t k);
  Laid pack(std::uint64_t k);
  // Waits until bucket k is packed; rethrows the packer's error, TimeoutError past the deadline.
  void await_packed(std::uint64_t k);
  // Bucket k to every engine: its request, and its handle on the engine's socket until answered.
  void deliver(std::uint64_t k);
  void deliver_to(std::uint64_t k, const ColocatedEngine& target,
                  comm::colocate::SegmentServer& server);
  // kCuda: the request alone (it carries the device segment's handle).
  void deliver_cuda(std::uint64_t k, const ColocatedEngine& target);
  // Bucket k's request to `target`, naming `handle`.
  UpdateWeightsFromTensorRequest request_for(std::uint64_t k, const ColocatedEngine& target,
                                             SegmentHandle handle) const;
  void record(EngineFailure failure) {
    std::lock_guard lock(mu_);
    result_.failures.push_back(std::move(failure));
    failed_ = true;
  }
  void stop_packer() {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }

  ColocatedSender& owner_;
  const UpdateSession& session_;
  std::span<const ColocatedEngine> engines_;
  const BucketSendOptions& options_;
  comm::Deadline deadline_{};

  std::vector<BucketPlan> plans_;
  std::size_t largest_ = 0;  // the largest bucket: what the sender's segments must hold
  std::unordered_map<std::string, const NamedTensor*> tensor_of_;
  std::vector<Laid> laid_;

  std::mutex mu_;  // guards what follows, and result_.failures
  std::condition_variable cv_;
  std::uint64_t packed_ = 0;    // buckets [0, packed_) are in their segment
  std::uint64_t answered_ = 0;  // buckets [0, answered_) were answered by every engine
  bool stop_ = false;
  std::exception_ptr pack_error_;
  std::atomic<bool> failed_{false};
  BucketSendResult result_;
};

void ColocatedSend::plan(std::span<const NamedTensor> tensors) {
  const std::vector<TensorMeta> metas = index_tensors(tensors, tensor_of_, result_);
  BucketSendOptions layout = options_;
  layout.load_format = LoadFormat::kWeightcastBucket;  // aligned tensors: whole cache lines
  plans_ = plan_send(metas, layout);
  largest_ = max_total_bytes(plans_);
  laid_.resize(plans_.size());
}

std::optional<ColocatedSend::Laid> ColocatedSend::in_place(std::uint64_t k) {
  // Every tensor of the bucket is there before any is read (here or by pack()).
  if (options_.await_tensor) {
    for (const BucketEntry& e : plans_[k].entries) options_.await_tensor(e.meta.name, deadline_);
  }
  if (owner_.segments_.memory() == ColocateMemory::kCuda) return std::nullopt;  // not a handle
  Laid laid;
  for (const BucketEntry& e : plans_[k].entries) {
    const NamedTensor& t = *tensor_of_.at(e.meta.name);
    if (t.bytes.empty()) {
      laid.offsets.push_back(0);  // nothing to read: any segment serves
      continue;
    }
    const auto where = comm::colocate::find_shared(t.bytes);
    if (!where || (laid.fd >= 0 && where->reader_fd != laid.fd)) return std::nullopt;
    laid.fd = where->reader_fd;
    laid.size = where->segment_size;
    laid.offsets.push_back(where->offset);
  }
  if (laid.fd < 0) return std::nullopt;
  for (const BucketEntry& e : plans_[k].entries) {
    const NamedTensor& t = *tensor_of_.at(e.meta.name);
    laid.digests.push_back(to_string(t.digest != nullptr ? *t.digest : tensor_digest(t.bytes)));
  }
  return laid;
}

ColocatedSend::Laid ColocatedSend::pack(std::uint64_t k) {
  if (auto laid = in_place(k)) return std::move(*laid);
  {
    // Segment k % 2 is written again only once bucket k - 2, which it held, was answered.
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return stop_ || k < answered_ + 2; });
    if (stop_) throw comm::Error("the data phase stopped");
  }
  owner_.segments_.reserve(largest_);
  comm::colocate::SharedSegment& segment = owner_.segments_.host(k);
  Laid laid{segment.reader_fd(), segment.size(), {}, {}, {}};
  std::byte* base = segment.bytes().data();
  for (const BucketEntry& e : plans_[k].entries) {
    const NamedTensor& t = *tensor_of_.at(e.meta.name);
    std::byte* out = base + e.offset;
    Hasher hasher;
    for (std::size_t at = 0; at < e.bytes; at += kChunk) {
      if (failed_) throw comm::Error("the data phase failed");
      const std::size_t n = std::min(kChunk, e.bytes - at);
      std::memcpy(out + at, t.bytes.data() + at, n);
      if (t.digest == nullptr) hasher.update({out + at, n});
    }
    laid.offsets.push_back(e.offset);
    laid.digests.push_back(to_string(t.digest != nullptr ? *t.digest : hasher.digest()));
  }
  if (owner_.segments_.memory() == ColocateMemory::kCuda) {
    comm::colocate::CudaIpcSegment& device = owner_.segments_.device(k);
    device.write(0, base, plans_[k].total_bytes);
    laid.fd = -1;
    laid.size = device.size();
    laid.cuda_ipc = device.handle().to_hex();
  }
  return laid;
}

void ColocatedSend::pack_all() {
  try {
    for (std::uint64_t k = 0; k < plans_.size(); ++k) {
      Laid laid = pack(k);
      std::lock_guard lock(mu_);
      if (stop_) return;
      laid_[k] = std::move(laid);
      packed_ = k + 1;
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mu_);
    pack_error_ = std::current_exception();
    cv_.notify_all();
  }
}

void ColocatedSend::await_packed(std::uint64_t k) {
  const auto start = comm::Clock::now();
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_until(lock, deadline_, [&] { return packed_ > k || pack_error_; });
  result_.pack_wait_seconds += seconds_since(start);
  if (packed_ > k) return;
  if (pack_error_) std::rethrow_exception(pack_error_);
  if (!done) {
    throw comm::TimeoutError("bucket " + std::to_string(k) +
                             " was not laid out before the data phase deadline");
  }
}

UpdateWeightsFromTensorRequest ColocatedSend::request_for(std::uint64_t k,
                                                          const ColocatedEngine& target,
                                                          SegmentHandle handle) const {
  auto request = session_.segment_request(plans_[k], laid_[k].offsets, std::move(handle),
                                          laid_[k].digests, target.member);
  WC_ENFORCE(request.session_id.has_value(), "engine ", target.engine->url(),
             " issued no session id: the colocated path needs one");
  return request;
}

void ColocatedSend::deliver_cuda(std::uint64_t k, const ColocatedEngine& target) {
  const auto request = request_for(k, target, {{}, laid_[k].size, laid_[k].cuda_ipc});
  try {
    target.engine->update_weights_from_tensor(request);
  } catch (...) {
    record(current_failure(target.engine->url(), kRoute));
  }
}

void ColocatedSend::deliver_to(std::uint64_t k, const ColocatedEngine& target,
                               comm::colocate::SegmentServer& server) {
  EngineApi* engine = target.engine;
  const Laid& laid = laid_[k];
  const auto request = std::make_shared<const UpdateWeightsFromTensorRequest>(
      request_for(k, target, {server.name(), laid.size, {}}));
  // Set (then the server woken) once the call returned, answered or failed: the serving stops at
  // once. The future alone is not enough: it becomes ready only after the wake.
  auto returned = std::make_shared<std::atomic<bool>>(false);
  std::future<void> answer = std::async(std::launch::async, [engine, request, &server, returned] {
    struct Wake {
      comm::colocate::SegmentServer& s;
      std::atomic<bool>& flag;
      ~Wake() {
        flag = true;
        s.wake();
      }
    } wake{server, *returned};
    engine->update_weights_from_tensor(*request);
  });
  try {
    // Every rank of the engine that asks gets the handle until the engine answered, even after a
    // failure elsewhere: an engine that connected waits for its handle (for its own timeout, a
    // minute by default), while handing it over costs one message.
    server.serve_until(
        *request->session_id, laid.fd, laid.size, [&] { return returned->load(); }, deadline_);
  } catch (const comm::TimeoutError&) {
    record({engine->url(), kRoute,
            "bucket " + std::to_string(k) + " not answered before the data phase deadline", false,
            true});
    return;  // `answer` waits for the call's own read timeout
  } catch (...) {
    record(current_failure(engine->url(), kRoute));
    return;
  }
  try {
    answer.get();
  } catch (...) {
    record(current_failure(engine->url(), kRoute));
  }
}

void ColocatedSend::deliver(std::uint64_t k) {
  const auto start = comm::Clock::now();
  std::vector<std::future<void>> deliveries;
  for (const ColocatedEngine& target : engines_) {
    if (!laid_[k].cuda_ipc.empty()) {
      deliveries.push_back(
          std::async(std::launch::async, [this, k, &target] { deliver_cuda(k, target); }));
      continue;
    }
    comm::colocate::SegmentServer& server = owner_.server_for(target.engine);
    deliveries.push_back(std::async(
        std::launch::async, [this, k, &target, &server] { deliver_to(k, target, server); }));
  }
  for (auto& d : deliveries) d.get();  // deliver_to() records its failures, never throws
  const double seconds = seconds_since(start);
  result_.broadcast_seconds += seconds;
  result_.http_wait_seconds += seconds;
  result_.wire_bytes += plans_[k].total_bytes;
}

BucketSendResult ColocatedSend::run(std::span<const NamedTensor> tensors) {
  const auto start = comm::Clock::now();
  deadline_ = start + options_.timeout;
  plan(tensors);
  result_.data_path = "colocated";
  if (plans_.empty() || engines_.empty()) {
    result_.seconds = seconds_since(start);
    return std::move(result_);
  }
  if (owner_.segments_.memory() == ColocateMemory::kHost) {
    for (const ColocatedEngine& target : engines_) owner_.server_for(target.engine);
  }
  std::thread packer([this] { pack_all(); });
  struct Join {
    ColocatedSend& s;
    std::thread& t;
    ~Join() {
      s.stop_packer();
      t.join();
    }
  } join{*this, packer};
  for (std::uint64_t k = 0; k < plans_.size() && !failed_; ++k) {
    if (stop_requested(options_, k, result_)) {
      failed_ = true;
      break;
    }
    try {
      await_packed(k);
      deliver(k);
    } catch (const comm::EnforceError&) {
      failed_ = true;
      throw;
    } catch (const std::exception& e) {
      result_.error = "bucket " + std::to_string(k) + " (colocated): " + e.what();
      result_.source_fault = true;  // the tensors' source or the packer, not an engine
      failed_ = true;
      break;
    }
    if (failed_) break;
    ++result_.buckets;
    {
      std::lock_guard lock(mu_);
      answered_ = k + 1;
      cv_.notify_all();
    }
    if (options_.bucket_delay.count() > 0) std::this_thread::sleep_for(options_.bucket_delay);
  }
  result_.ok = !failed_ && result_.failures.empty() && result_.error.empty();
  result_.seconds = seconds_since(start);
  return std::move(result_);
}

comm::colocate::SegmentServer& ColocatedSender::server_for(const EngineApi* engine) {
  auto& server = servers_[engine];
  if (!server) server = std::make_unique<comm::colocate::SegmentServer>();
  return *server;
}

BucketSendResult ColocatedSender::send(const UpdateSession& session,
                                       std::span<const ColocatedEngine> engines,
                                       std::span<const NamedTensor> tensors,
                                       const BucketSendOptions& options) {
  ColocatedSend send(*this, session, engines, options);
  BucketSendResult result = send.run(tensors);
  // An engine that did not answer may still be copying out of a device segment.
  if (!result.ok && segments_.memory() == ColocateMemory::kCuda) segments_.retire_device();
  return result;
}

void merge_beside(BucketSendResult& chain, BucketSendResult colocated) {
  // The chain's counts are the report's: the same tensors, and its buckets and broadcasts.
  colocated.tensors = colocated.bytes = colocated.buckets = colocated.delta_buckets = 0;
  colocated.broadcast_seconds = colocated.hash_wait_seconds = 0;
  colocated.delta_change.clear();
  merge_parallel(chain, std::move(colocated));
}

}  // namespace weightcast::sync::trainer

#include "sync/trainer/bucket_sender.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "comm/errors.h"
#include "sync/model/checksum.h"
#include "sync/trainer/bucket_broadcast.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/packer.h"

namespace weightcast::sync::trainer {

namespace {

using comm::seconds_since;

class Sender {
 public:
  Sender(const UpdateSession& session, const std::string& group, comm::Communicator& comm,
         std::span<EngineApi* const> engines, const BucketSendOptions& options,
         std::span<const std::size_t> members)
      : session_(session),
        group_(group),
        comm_(comm),
        engines_(engines),
        members_(members),
        options_(options),
        broadcaster_(comm, options.memory, options.load_format, result_.broadcast_seconds) {}

  BucketSendResult run(std::span<const NamedTensor> tensors);

 private:
  struct InFlight {
    std::uint64_t bucket = 0;
    std::vector<std::future<void>> answers;  // one per engine
  };

  void issue(std::uint64_t k, const std::optional<BucketDelta>& delta);
  // Our format: digests the new bytes of every bucket's tensors, in order, ahead of the sends
  // (a thread of its own, started by run()), so a request carries them before its bucket is
  // packed; the look-ahead request k+1 goes out before bucket k is broadcast once they are made.
  void hash_ahead();
  // Bucket k's digests (waits for hash_ahead, bounded by the phase deadline; rethrows its error).
  std::vector<std::string> digests_of(std::uint64_t k);
  // Whether bucket k's digests are made (or none are sent), without waiting.
  bool digests_ready(std::uint64_t k) const;
  // Sends the requests of buckets [next_, last] (bounded by max_in_flight, never waiting for
  // bucket k's own answer). False when the phase failed meanwhile.
  bool issue_through(std::uint64_t last, std::uint64_t k, comm::Deadline deadline,
                     const std::optional<BucketDelta>& delta);
  // Collects the answers of the oldest bucket in flight, waiting until `deadline`.
  void collect_oldest(comm::Deadline deadline);
  // A planned tensor (its bytes and any producer's digest), once options_.await_tensor says
  // they are there.
  const NamedTensor& awaited(const BucketEntry& entry) const;
  // Its bytes, for a send that needs them as one span (a slice view must be packed).
  std::span<const std::byte> tensor_bytes(const BucketEntry& entry) const {
    const NamedTensor& t = awaited(entry);
    WC_ENFORCE(t.view == nullptr, "tensor ", t.meta.name, " is a slice view: it must be packed");
    return t.bytes;
  }
  // Marks the phase failed and aborts the communicator so a blocked broadcast returns.
  void fail();
  void record(EngineFailure failure);

  const UpdateSession& session_;
  const std::string& group_;
  comm::Communicator& comm_;
  std::span<EngineApi* const> engines_;
  std::span<const std::size_t> members_;  // empty: engine i is member i of the session
  const BucketSendOptions& options_;

  std::vector<BucketPlan> plans_;
  std::unordered_map<std::string, const NamedTensor*> tensor_of_;
  std::deque<InFlight> in_flight_;
  std::atomic<bool> failed_{false};
  std::mutex mu_;  // guards result_.failures against the request threads
  BucketSendResult result_;
  BucketBroadcaster broadcaster_;  // the data plane
  // hash_ahead()'s results, one per bucket; empty when requests carry no digests.
  std::vector<std::promise<std::vector<std::string>>> digests_promised_;
  std::vector<std::future<std::vector<std::string>>> digests_;
  std::thread hasher_;
  // Bucket k acquired from the packer, with its delta (nullopt: in full).
  struct Ready {
    std::span<std::byte> bucket;
    std::optional<BucketDelta> encoded;
  };
  // Indexes the tensors and plans the buckets.
  void plan(std::span<const NamedTensor> tensors);
  // The data phase proper: the packer, then every bucket in order.
  void send_all();
  // Bucket k of a packed send: acquired (or taken from ready_), broadcast, released; with deltas
  // the next bucket is acquired and announced at once. False when the phase failed.
  bool send_packed(BucketPacker& packer, std::uint64_t k);
  // Bucket k from the packer; with deltas its request is sent now, since it says how the bucket
  // travels. nullopt when the phase failed.
  std::optional<Ready> acquire(BucketPacker& packer, std::uint64_t k);

  comm::Deadline deadline_{};
  DeltaSource* delta_ = nullptr;  // the stage's base (our format only), or null
  bool deltas_ = false;           // this update sends deltas against it
  std::optional<Ready> ready_;    // the next bucket, acquired (and announced) ahead
  std::uint64_t next_ = 0;        // next bucket whose request is not sent yet
  // Per packer slot: the delta of the bucket packed there (nullopt: in full) and its payload.
  std::optional<BucketDelta> encoded_[2];
  std::vector<std::byte> payloads_[2];
};

void Sender::fail() {
  failed_ = true;
  comm_.abort();
}

void Sender::record(EngineFailure failure) {
  std::lock_guard lock(mu_);
  result_.failures.push_back(std::move(failure));
}

void Sender::hash_ahead() {
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    try {
      std::vector<std::string> out;
      for (const BucketEntry& e : plans_[k].entries) {
        if (failed_) throw comm::Error("the data phase failed");
        // A producer's digest comes with the bytes; a slice view's is read from its runs.
        out.push_back(to_string(digest_of(awaited(e))));
      }
      digests_promised_[k].set_value(std::move(out));
    } catch (...) {
      // The bucket's request (and every later one) fails with it: a trainer-side fault.
      for (std::size_t j = k; j < plans_.size(); ++j) {
        digests_promised_[j].set_exception(std::current_exception());
      }
      return;
    }
  }
}

bool Sender::digests_ready(std::uint64_t k) const {
  return digests_.empty() ||
         digests_[k].wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

std::vector<std::string> Sender::digests_of(std::uint64_t k) {
  if (digests_.empty()) return {};
  auto& f = digests_[k];
  const auto start = comm::Clock::now();
  const auto ready = f.wait_until(deadline_);
  result_.hash_wait_seconds += seconds_since(start);
  if (ready != std::future_status::ready) {
    throw comm::TimeoutError("the digests of bucket " + std::to_string(k) +
                             " were not ready before the data phase deadline");
  }
  return f.get();
}

void Sender::issue(std::uint64_t k, const std::optional<BucketDelta>& delta) {
  auto base = session_.bucket_request(plans_[k], group_, options_.load_format);
  base.delta = delta;
  base.digests = digests_of(k);
  InFlight flight{k, {}};
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    EngineApi* engine = engines_[e];
    // The last engine takes the base itself: a bucket of experts lists thousands of tensors.
    auto request = std::make_shared<const UpdateWeightsFromDistributedRequest>(session_.for_engine(
        e + 1 == engines_.size() ? std::move(base) : base, members_.empty() ? e : members_[e]));
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

bool Sender::issue_through(std::uint64_t last, std::uint64_t k, comm::Deadline deadline,
                           const std::optional<BucketDelta>& delta) {
  while (next_ <= last && !failed_) {
    while (in_flight_.size() >= options_.max_in_flight && in_flight_.front().bucket < k) {
      collect_oldest(deadline);
    }
    // A failure seen while collecting ends the phase here: one more request would reach a
    // silent engine too, and its answer is awaited for a whole read timeout.
    if (failed_ || in_flight_.size() >= options_.max_in_flight) break;
    issue(next_, next_ == k ? delta : std::nullopt);
    ++next_;
  }
  return !failed_;
}

const NamedTensor& Sender::awaited(const BucketEntry& entry) const {
  if (options_.await_tensor) options_.await_tensor(entry.meta.name, deadline_);
  return *tensor_of_.at(entry.meta.name);
}

void Sender::plan(std::span<const NamedTensor> tensors) {
  plans_ = plan_send(index_tensors(tensors, tensor_of_, result_), options_);
  if (options_.memory == comm::MemoryKind::kCuda) broadcaster_.reserve(max_total_bytes(plans_));
}

std::optional<Sender::Ready> Sender::acquire(BucketPacker& packer, std::uint64_t k) {
  const auto pack_start = comm::Clock::now();
  Ready r{packer.acquire(k, deadline_), std::nullopt};
  result_.pack_wait_seconds += seconds_since(pack_start);
  if (delta_ != nullptr) r.encoded = std::move(encoded_[k % 2]);
  if (failed_ || (deltas_ && !issue_through(k, k, deadline_, r.encoded))) return std::nullopt;
  return r;
}

bool Sender::send_packed(BucketPacker& packer, std::uint64_t k) {
  std::optional<Ready> r = ready_ ? std::exchange(ready_, std::nullopt) : acquire(packer, k);
  if (!r) return false;
  if (r->encoded) {
    auto& payload = payloads_[k % 2];
    broadcaster_.payload({payload.data(), payload.size()}, deadline_);
    result_.wire_bytes += payload.size();
    result_.delta_buckets += 1;
  } else {
    const auto sent = comm::Clock::now();
    broadcaster_.bucket(plans_[k], r->bucket, deadline_);
    result_.wire_bytes += r->bucket.size();
    if (delta_ != nullptr) delta_->note_full_broadcast(r->bucket.size(), seconds_since(sent));
  }
  packer.release(k);
  // With deltas the next request goes out now, before any pause between broadcasts, so engines
  // post its receive early (and notice at once when this source dies there).
  return !(deltas_ && k + 1 < plans_.size() && !(ready_ = acquire(packer, k + 1)));
}

void Sender::send_all() {
  const auto n = static_cast<std::uint64_t>(plans_.size());
  const bool unpacked =
      options_.load_format == LoadFormat::kPerTensor && options_.memory == comm::MemoryKind::kHost;
  BucketPacker::AfterPack after_pack;
  if (delta_ != nullptr) {
    after_pack = [this](std::uint64_t k, std::size_t slot, std::span<const std::byte> packed) {
      encoded_[slot] = delta_->encode(k, packed, payloads_[slot]);
    };
  }
  // Nothing to pack at all for unpacked sends: an empty plan list keeps the packer idle.
  const std::vector<BucketPlan> none;
  // The packer lends a tensor's own bytes where they are the bucket (a view's are empty: never
  // lent) and writes the others into its buffers (a view run by run, straight from its tensor).
  BucketPacker packer(
      unpacked ? none : plans_, [&](const BucketEntry& e) { return awaited(e).bytes; }, 2,
      options_.pack_buffers, std::move(after_pack),
      [&](const BucketEntry& e, std::span<std::byte> out) { write_tensor(awaited(e), out); });
  for (std::uint64_t k = 0; k < n && !failed_; ++k) {
    if (stop_requested(options_, k, result_)) {
      fail();
      break;
    }
    try {
      // Without deltas, requests k (required) and k+1 (look-ahead) go out before bucket k is
      // broadcast, except that the first broadcast does not wait for the second bucket's
      // digests (it would wait for two buckets' hashing instead of one). With deltas, request k
      // goes out once bucket k is encoded (acquire()).
      if (!deltas_) {
        const bool ahead = k + 1 < n && (k > 0 || digests_ready(k + 1));
        if (!issue_through(ahead ? k + 1 : k, k, deadline_, std::nullopt)) break;
      }
      if (unpacked) {
        broadcaster_.tensors(
            plans_[k], [this](const BucketEntry& e) { return tensor_bytes(e); }, deadline_);
        result_.wire_bytes += plans_[k].total_bytes;
      } else if (!send_packed(packer, k)) {
        break;
      }
      ++result_.buckets;
      if (options_.bucket_delay.count() > 0) std::this_thread::sleep_for(options_.bucket_delay);
    } catch (const comm::EnforceError&) {
      fail();
      throw;
    } catch (const std::exception& e) {
      if (result_.error.empty()) {
        result_.error = "bucket " + std::to_string(k) + " on group " + group_ + ": " + e.what();
        result_.source_fault = !broadcaster_.failed();
      }
      fail();
    }
  }
}

BucketSendResult Sender::run(std::span<const NamedTensor> tensors) {
  const auto start = comm::Clock::now();
  deadline_ = start + options_.timeout;
  WC_ENFORCE_GE(options_.max_in_flight, std::size_t{1});
  plan(tensors);
  delta_ = options_.load_format == LoadFormat::kWeightcastBucket ? options_.delta : nullptr;
  deltas_ = delta_ != nullptr && delta_->begin(plans_, session_.delta_base());
  if (delta_ != nullptr) result_.delta_change = delta_->change();
  // SGLang's request type has no digests field: only our format carries them.
  if (options_.load_format == LoadFormat::kWeightcastBucket) {
    digests_promised_.resize(plans_.size());
    for (auto& p : digests_promised_) digests_.push_back(p.get_future());
    hasher_ = std::thread([this] { hash_ahead(); });
  }
  // Joined on every way out (send_all() rethrows EnforceError); after a failure the hasher stops
  // at its next tensor.
  struct JoinHasher {
    Sender& s;
    ~JoinHasher() {
      if (s.hasher_.joinable()) s.hasher_.join();
    }
  } join_hasher{*this};
  send_all();
  // After the packer stopped: it no longer writes the base.
  if (delta_ != nullptr) {
    delta_->finish(!failed_ && result_.buckets == plans_.size(), session_.version());
  }
  const comm::Deadline last =
      failed_ ? std::min(deadline_, comm::Clock::now() + options_.failure_grace) : deadline_;
  while (!in_flight_.empty()) collect_oldest(last);

  result_.ok = !failed_ && result_.failures.empty() && result_.error.empty();
  result_.seconds = seconds_since(start);
  return std::move(result_);
}

}  // namespace

std::vector<TensorMeta> index_tensors(std::span<const NamedTensor> tensors,
                                      std::unordered_map<std::string, const NamedTensor*>& by_name,
                                      BucketSendResult& result) {
  std::vector<TensorMeta> metas;
  for (const auto& t : tensors) {
    WC_ENFORCE_EQ(tensor_size(t), t.meta.byte_count(), "bytes of tensor ", t.meta.name);
    WC_ENFORCE(by_name.emplace(t.meta.name, &t).second, "duplicate tensor ", t.meta.name);
    metas.push_back(t.meta);
    result.bytes += tensor_size(t);
  }
  result.tensors += metas.size();
  return metas;
}

std::vector<BucketPlan> plan_send(std::span<const TensorMeta> metas,
                                  const BucketSendOptions& options) {
  const std::size_t alignment = options.load_format == LoadFormat::kWeightcastBucket
                                    ? kDefaultBucketAlignment
                                    : std::size_t{1};
  std::vector<AtomicGroup> groups;
  const std::vector<TensorMeta> list(metas.begin(), metas.end());
  if (options.atomic_groups) groups = atomic_groups(list, *options.atomic_groups);
  return plan_buckets(list, options.bucket_bytes, alignment, groups);
}

void reserve_send_buffers(std::span<const TensorMeta> metas, const BucketSendOptions& options) {
  const bool unpacked =
      options.load_format == LoadFormat::kPerTensor && options.memory == comm::MemoryKind::kHost;
  if (unpacked) return;
  std::size_t bytes = 0, packed = 0;
  for (const BucketPlan& plan : plan_send(metas, options)) {
    if (packs_as_is(plan)) continue;
    bytes = std::max(bytes, plan.total_bytes);
    packed += 1;
  }
  const auto& pool = options.pack_buffers ? options.pack_buffers : default_pack_buffers();
  pool->reserve(bytes, std::min<std::size_t>(packed, 2));  // BucketPacker's ring of two
}

bool stop_requested(const BucketSendOptions& options, std::uint64_t k, BucketSendResult& result) {
  if (!options.stop_requested || !options.stop_requested()) return false;
  if (result.error.empty()) result.error = "interrupted before bucket " + std::to_string(k);
  result.source_fault = true;  // the sender stopped, no engine failed
  return true;
}

BucketSendResult send_buckets(const UpdateSession& session, const std::string& group_name,
                              comm::Communicator& comm, std::span<EngineApi* const> engines,
                              std::span<const NamedTensor> tensors,
                              const BucketSendOptions& options,
                              std::span<const std::size_t> members) {
  WC_ENFORCE(members.empty() || members.size() == engines.size(), "members of ", engines.size(),
             " engines: ", members.size());
  Sender sender(session, group_name, comm, engines, options, members);
  return sender.run(tensors);
}

void merge_parallel(BucketSendResult& into, BucketSendResult other) {
  into.ok = into.ok && other.ok;
  into.tensors += other.tensors;
  into.bytes += other.bytes;
  into.buckets += other.buckets;
  into.wire_bytes += other.wire_bytes;
  into.delta_buckets += other.delta_buckets;
  into.seconds = std::max(into.seconds, other.seconds);
  into.http_wait_seconds += other.http_wait_seconds;
  into.pack_wait_seconds += other.pack_wait_seconds;
  into.broadcast_seconds += other.broadcast_seconds;
  into.hash_wait_seconds += other.hash_wait_seconds;
  into.failures.insert(into.failures.end(), other.failures.begin(), other.failures.end());
  if (into.error.empty() && !other.error.empty()) {
    into.error = std::move(other.error);
    into.source_fault = other.source_fault;
  }
  if (into.delta_change.empty()) into.delta_change = std::move(other.delta_change);
  if (!other.data_path.empty() && into.data_path != other.data_path) {
    into.data_path += "+" + other.data_path;
  }
}

}  // namespace weightcast::sync::trainer

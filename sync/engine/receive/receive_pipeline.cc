#include "sync/engine/receive/receive_pipeline.h"

#include <variant>

#include <algorithm>
#include <span>

#include "comm/device_memory.h"
#include "comm/errors.h"
#include "sync/engine/receive/receive_digests.h"
#include "sync/model/delta.h"

namespace weightcast::sync::engine {

namespace {
// Worker threads re-check for stop and for expired waits at this period.
constexpr comm::Millis kPoll{50};
// How long a rank that saw a peer leave waits for another rank of this engine to fail on its own
// before it reports the peer's departure (Group::receive_loop).
constexpr comm::Millis kPeerGrace{200};
}  // namespace

int failure_status(const std::exception& error) {
  return dynamic_cast<const comm::TimeoutError*>(&error) != nullptr ? 504 : 500;
}

BucketJob::BucketJob(std::uint64_t session_id, BucketPlan plan,
                     std::vector<std::vector<Runner>> destinations,
                     std::shared_ptr<Staging> staging, bool per_tensor,
                     std::shared_ptr<const DeltaSpec> delta, std::vector<Digest> expected)
    : session_id_(session_id),
      plan_(std::move(plan)),
      destinations_(std::move(destinations)),
      staging_(std::move(staging)),
      per_tensor_(per_tensor),
      delta_(std::move(delta)),
      expected_(std::move(expected)) {
  WC_ENFORCE_EQ(destinations_.size(), plan_.entries.size());
  WC_ENFORCE(expected_.empty() || expected_.size() == plan_.entries.size(),
             "one expected digest per tensor");
  WC_ENFORCE(staging_ != nullptr);
  WC_ENFORCE(!(per_tensor_ && delta_), "a delta bucket travels as one broadcast");
  WC_ENFORCE(!delta_ || delta_->fill_base, "a delta bucket needs its base");
}

void BucketJob::finish(JobResult result) {
  {
    std::lock_guard lock(mu_);
    if (result_) return;
    result_ = std::move(result);
  }
  cv_.notify_all();
}

std::optional<JobResult> BucketJob::wait(comm::Deadline deadline) const {
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return result_.has_value(); })) return std::nullopt;
  return result_;
}

// Where one bucket of one rank lands. Host ranks receive straight into a pool block, which rank
// 0's staging then keeps as the tensors' memory (no copy). Device ranks receive into a device
// buffer reused across buckets and copy it into a pool block for staging. A delta payload lands
// in a pool block too (device ranks copy it there), so deltas need no memory beyond the pool.
struct Group::RecvBuffer {
  comm::MemoryKind kind = comm::MemoryKind::kHost;
  std::shared_ptr<const Block> block;
  void* device = nullptr;
  std::size_t device_capacity = 0;
  std::size_t size = 0;

  ~RecvBuffer() { comm::cuda_free(device); }

  void* device_buffer(std::size_t bytes) {
    if (bytes > device_capacity) {
      comm::cuda_free(device);
      device = nullptr;
      device_capacity = 0;
      device = comm::cuda_alloc(bytes);
      device_capacity = bytes;
    }
    return device;
  }

  void* prepare(BlockPool& pool, std::size_t bytes) {
    size = bytes;
    if (kind == comm::MemoryKind::kHost) {
      block = pool.acquire(bytes);
      return block->data();
    }
    return device_buffer(bytes);
  }

  // The payload received by prepare(), as host bytes in a pool block.
  std::span<const std::byte> take_payload(BlockPool& pool) {
    if (kind != comm::MemoryKind::kHost) {
      block = pool.acquire(size);
      comm::cuda_copy_to_host(block->data(), device, size);
    }
    return {block->data(), size};
  }

  // The received bucket in a host block, handed over to the caller.
  std::shared_ptr<const Block> take_host(BlockPool& pool) {
    if (kind == comm::MemoryKind::kHost) return std::move(block);
    auto host = pool.acquire(size);
    comm::cuda_copy_to_host(host->data(), device, size);
    return host;
  }
};

struct Group::Rank {
  std::unique_ptr<BucketChannel> channel;
  std::uint64_t cursor = 0;  // next sequence to receive
  RecvBuffer buffers[2];
  bool buffer_busy[2] = {false, false};
  std::deque<Unpack> unpack_queue;
  std::unique_ptr<DeltaDecoder> decoder;  // delta buckets; the unpack thread's alone
};

Group::Group(GroupSpec spec, std::vector<std::unique_ptr<BucketChannel>> channels,
             GroupOptions opts)
    : spec_(std::move(spec)),
      opts_(opts),
      pool_(opts_.pool ? opts_.pool : std::make_shared<BlockPool>()) {
  WC_ENFORCE(!channels.empty(), "a group needs at least one engine rank");
  WC_ENFORCE_GT(opts_.comm_timeout.count(), 0);
  for (auto& channel : channels) {
    WC_ENFORCE(channel != nullptr);
    auto rank = std::make_unique<Rank>();
    rank->buffers[0].kind = rank->buffers[1].kind = channel->memory();
    rank->channel = std::move(channel);
    ranks_.push_back(std::move(rank));
  }
  for (int r = 0; r < rank_count(); ++r) {
    threads_.emplace_back([this, r] { receive_loop(r); });
    threads_.emplace_back([this, r] { unpack_loop(r); });
  }
}

Group::~Group() {
  abort(500, "group '" + spec_.group_name + "' destroyed");
  threads_.clear();  // joins
}

std::optional<Refusal> Group::submit(const std::shared_ptr<BucketJob>& job) {
  std::unique_lock lock(mu_);
  const std::string where = "group '" + spec_.group_name + "'";
  if (stopping_)
    return Refusal{409, where + " is aborted (" + abort_reason_ + "); re-initialize it"};
  if (job->session_id() != session_id_) {
    if (!pending_.empty()) {
      return Refusal{409, where + " still has buckets of a previous session in flight"};
    }
    session_id_ = job->session_id();
    for (auto& rank : ranks_) rank->cursor = 0;
  }
  std::uint64_t low = ranks_[0]->cursor;
  for (auto& rank : ranks_) low = std::min(low, rank->cursor);
  const std::uint64_t seq = job->sequence();
  bool taken = pending_.count(seq) != 0;
  for (auto& rank : ranks_) taken = taken || seq < rank->cursor;
  if (taken) {
    return Refusal{409, "sequence: bucket " + std::to_string(seq) + " of " + where +
                            " was already sent in this session"};
  }
  if (seq >= low + opts_.max_ahead) {
    return Refusal{429, "sequence: bucket " + std::to_string(seq) + " is more than " +
                            std::to_string(opts_.max_ahead) + " ahead of the next expected (" +
                            std::to_string(low) + ") in " + where};
  }
  pending_.emplace(seq, job);
  used_ = true;
  lock.unlock();
  cv_.notify_all();
  return std::nullopt;
}

bool Group::busy() const {
  std::lock_guard lock(mu_);
  return !pending_.empty();
}

bool Group::used_in(std::uint64_t session_id) const {
  std::lock_guard lock(mu_);
  return used_ && session_id_ == session_id;
}

bool Group::aborted() const {
  std::lock_guard lock(mu_);
  return stopping_;
}

std::string Group::abort_reason() const {
  std::lock_guard lock(mu_);
  return abort_reason_;
}

// The bucket's layout as the sender built it, checked against --max-bucket-bytes before anything
// is allocated for it (the receive buffers grow to this size).
std::variant<Refusal, BucketPlan> plan_bucket(const UpdateWeightsFromDistributedRequest& request,
                                              std::uint64_t sequence, std::size_t max_bytes) {
  BucketPlan plan;
  try {
    // SGLang's layouts (per tensor, flattened bucket) put tensors back to back; ours aligns.
    const std::size_t alignment = request.load_format == LoadFormat::kWeightcastBucket
                                      ? kDefaultBucketAlignment
                                      : std::size_t{1};
    plan = make_bucket(sequence, request.tensors, alignment);
  } catch (const comm::BadRequestError& e) {
    return Refusal{400, e.what()};
  }
  if (plan.total_bytes > max_bytes) {
    return Refusal{
        400, "shapes: the bucket holds " + std::to_string(plan.total_bytes) +
                 " bytes (with alignment), over --max-bucket-bytes = " + std::to_string(max_bytes)};
  }
  return plan;
}

std::string Group::data_path() const {
  return ranks_.empty() ? std::string() : ranks_[0]->channel->data_path();
}

std::uint64_t Group::bytes_received() const {
  std::lock_guard lock(mu_);
  return bytes_received_;
}

std::uint64_t Group::buckets_received() const {
  std::lock_guard lock(mu_);
  return buckets_received_;
}

void Group::abort(int status, const std::string& reason) {
  fail(status, reason);
}

void Group::fail(int status, const std::string& reason) {
  std::unique_lock lock(mu_);
  fail_locked(status, reason, lock);
}

void Group::fail_locked(int status, const std::string& reason, std::unique_lock<std::mutex>& lock) {
  if (stopping_) return;
  stopping_ = true;
  abort_reason_ = reason;
  auto jobs = std::move(pending_);
  pending_.clear();
  lock.unlock();
  // Channels are aborted without the lock: a blocked receive returns and its thread then needs it.
  for (auto& rank : ranks_) rank->channel->abort();
  for (auto& [seq, job] : jobs) job->finish({status, reason});
  cv_.notify_all();
  lock.lock();
}

std::shared_ptr<BucketJob> Group::next_job(int r, int& slot) {
  Rank& rank = *ranks_[static_cast<std::size_t>(r)];
  std::unique_lock lock(mu_);
  // Set when this rank starts waiting for a missing bucket; Deadline::max() while not waiting.
  comm::Deadline gap_deadline = comm::Deadline::max();
  for (;;) {
    if (stopping_) return nullptr;
    auto it = pending_.find(rank.cursor);
    const int want = static_cast<int>(rank.cursor % 2);
    if (it != pending_.end()) {
      // The buffer is freed by this rank's unpack thread, which always makes progress.
      if (!rank.buffer_busy[want]) {
        slot = want;
        rank.buffer_busy[want] = true;
        return it->second;
      }
    } else if (pending_.upper_bound(rank.cursor) != pending_.end()) {
      // A later bucket is queued but this one has not arrived: bounded by the group timeout.
      if (gap_deadline == comm::Deadline::max()) {
        gap_deadline = comm::deadline_after(opts_.comm_timeout);
      } else if (comm::expired(gap_deadline)) {
        fail_locked(504,
                    "bucket " + std::to_string(rank.cursor) + " of group '" + spec_.group_name +
                        "' never arrived while later buckets waited (" +
                        std::to_string(opts_.comm_timeout.count()) + " ms)",
                    lock);
        return nullptr;
      }
    } else {
      gap_deadline = comm::Deadline::max();
    }
    cv_.wait_for(lock, kPoll);
  }
}

void Group::receive_loop(int r) {
  Rank& rank = *ranks_[static_cast<std::size_t>(r)];
  for (;;) {
    int slot = 0;
    auto job = next_job(r, slot);
    if (!job) return;
    const std::size_t total = job->wire_bytes();
    std::vector<std::optional<Digest>> digests;
    try {
      if (job->delta()) {
        rank.channel->receive(rank.buffers[slot].prepare(*pool_, total), total, opts_.comm_timeout,
                              {});
      } else if (void* data = rank.buffers[slot].prepare(*pool_, total); job->per_tensor()) {
        // One broadcast per tensor, each into its place: the unpack below is the same.
        for (const BucketEntry& entry : job->plan().entries) {
          rank.channel->receive(static_cast<std::byte*>(data) + entry.offset, entry.bytes,
                                opts_.comm_timeout, {});
        }
      } else if (rank.channel->memory() == comm::MemoryKind::kHost) {
        // Each piece digested as it lands, while it is in the cache (receive_digests.h).
        std::vector<bool> wanted;
        for (const auto& runners : job->destinations()) wanted.push_back(!runners.empty());
        ReceiveDigests digester(job->plan(), wanted, static_cast<const std::byte*>(data));
        rank.channel->receive(
            data, total, opts_.comm_timeout,
            [&](std::size_t offset, std::size_t bytes) { digester.received(offset, bytes); });
        digests = digester.take();
      } else {
        rank.channel->receive(data, total, opts_.comm_timeout, {});
      }
    } catch (const std::exception& e) {
      // A peer that left is often another rank of this engine, which failed on its own (timed
      // out, was refused) and hung up before it could say so: its failure is the one to report.
      if (ranks_.size() > 1 && dynamic_cast<const comm::PeerError*>(&e) != nullptr) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, kPeerGrace, [&] { return stopping_; });
      }
      fail(failure_status(e), engine_rank_text(r) + " (group rank " +
                                  std::to_string(rank.channel->group_rank()) + "), bucket " +
                                  std::to_string(job->sequence()) + ": " + e.what());
      return;
    }
    {
      std::lock_guard lock(mu_);
      bytes_received_ += total;
      rank.cursor += 1;
      rank.unpack_queue.push_back({std::move(job), slot, std::move(digests)});
    }
    cv_.notify_all();
  }
}

std::string Group::engine_rank_text(int r) const {
  return "engine rank " + std::to_string(opts_.engine_rank + opts_.first_rank + r);
}

void Group::stage_bucket(int r, BucketJob& job, std::shared_ptr<const Block> block,
                         const std::vector<std::optional<Digest>>& received) {
  const std::span<std::byte> bytes(block->data(), job.plan().total_bytes);
  const auto views = unpack(bytes, job.plan());
  // One digest per routed tensor: made as it was received where the path reports pieces, else
  // here, while the next bucket is on the wire. All are checked against the trainer's before the
  // first is staged, so a bucket that decoded wrong stages nothing.
  std::vector<Digest> digests(views.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (job.destinations()[i].empty()) continue;  // dropped, not checked
    digests[i] = i < received.size() && received[i] ? *received[i] : tensor_digest(views[i].bytes);
    if (!job.expected_.empty() && digests[i] != job.expected_[i]) {
      job.finish({500,
                  engine_rank_text(r) + ", bucket " + std::to_string(job.sequence()) +
                      ": tensor '" + views[i].entry->meta.name + "' holds digest " +
                      to_string(digests[i]) + " after " +
                      (job.delta() ? "decoding the delta" : "the broadcast") +
                      ", the trainer sent " + to_string(job.expected_[i]),
                  true});
      return;
    }
  }
  // Rank 0 keeps a view of the block (sharing its ownership), the other ranks only the digest;
  // with distinct staging (shard plans) every rank offers its view and staging keeps new ones.
  const int rank = opts_.first_rank + r;
  const bool keep = rank == 0 || job.staging().distinct();
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& runners = job.destinations()[i];
    if (runners.empty()) continue;
    const Digest& digest = digests[i];
    const auto offset = static_cast<std::size_t>(views[i].bytes.data() - bytes.data());
    for (Runner runner : runners) {
      SharedBytes view;
      if (keep) view = SharedBytes(block, bytes.subspan(offset, views[i].bytes.size()));
      job.staging().stage(runner, rank, views[i].entry->meta, std::move(view), digest);
    }
  }
}

void Group::apply_delta(int r, BucketJob& job, int slot) {
  const DeltaSpec& delta = *job.delta();
  auto block = pool_->acquire(job.plan().total_bytes);
  const std::span<std::byte> bucket(block->data(), job.plan().total_bytes);
  std::optional<std::string> refusal = delta.fill_base(job.plan(), job.destinations(), bucket);
  int status = 409;
  if (!refusal) {
    Rank& rank = *ranks_[static_cast<std::size_t>(r)];
    // One decoder per rank, kept across buckets (its context and scratch are reused).
    if (!rank.decoder || rank.decoder->codec() != delta.codec) {
      rank.decoder = std::make_unique<DeltaDecoder>(delta.codec);
    }
    try {
      rank.decoder->decode(rank.buffers[slot].take_payload(*pool_), bucket);
    } catch (const comm::BadRequestError& e) {
      refusal = e.what();
      status = 400;
    }
  }
  if (refusal) {
    job.finish(
        {status,
         engine_rank_text(r) + ", bucket " + std::to_string(job.sequence()) + ": " + *refusal,
         true});
    return;
  }
  if (test_hooks::after_delta_decode) test_hooks::after_delta_decode(job.plan(), bucket);
  stage_bucket(r, job, std::move(block), {});
}

void Group::unpack_loop(int r) {
  Rank& rank = *ranks_[static_cast<std::size_t>(r)];
  for (;;) {
    Unpack item;
    {
      std::unique_lock lock(mu_);
      while (!stopping_ && rank.unpack_queue.empty()) cv_.wait_for(lock, kPoll);
      if (stopping_) return;
      item = std::move(rank.unpack_queue.front());
      rank.unpack_queue.pop_front();
    }
    BucketJob& job = *item.job;
    try {
      if (job.delta()) {
        apply_delta(r, job, item.slot);
      } else {
        stage_bucket(r, job, rank.buffers[item.slot].take_host(*pool_), item.digests);
      }
    } catch (const std::exception& e) {
      fail(500, engine_rank_text(r) + ", bucket " + std::to_string(job.sequence()) +
                    ": unpack failed: " + e.what());
      return;
    }
    bool complete = false;
    {
      std::lock_guard lock(mu_);
      rank.buffer_busy[item.slot] = false;
      if (++job.ranks_done_ == rank_count()) {
        complete = true;
        buckets_received_ += 1;
        pending_.erase(job.sequence());
      }
    }
    cv_.notify_all();
    if (complete) {
      if (job.staging().discarded()) {
        job.finish({409, "the session of bucket " + std::to_string(job.sequence()) +
                             " was aborted; its data was discarded"});
      } else {
        job.finish({200, ""});
      }
    }
  }
}

}  // namespace weightcast::sync::engine

#include "launcher/train/stage_gather.h"

#include <algorithm>
#include <span>
#include <utility>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"

namespace weightcast::launcher::train {

using sync::trainer::MegatronParam;

StageGather::StageGather(std::vector<MegatronParam> params, int tp, int tp_rank, int ep,
                         int ep_rank, std::size_t group_bytes)
    : params_(std::move(params)), tp_(tp), ep_(ep) {
  WC_ENFORCE_GE(tp, 1);
  WC_ENFORCE_GE(ep, 1);
  WC_ENFORCE(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  WC_ENFORCE_GT(group_bytes, std::size_t{0});
  Group g;
  std::size_t full = 0;  // full bytes of the params in g
  for (std::size_t p = 0; p < params_.size(); ++p) {
    const MegatronParam& param = params_[p];
    if (p > g.first_param && full + param.byte_count() > group_bytes) {
      groups_.push_back(g);
      g = Group{p, p, g.end_tensor, g.end_tensor, g.offset + g.bytes, 0};
      full = 0;
    }
    g.end_param = p + 1;
    g.end_tensor += param.parts.size();
    // EP replicas past the first `ep` data-parallel ranks hold nothing new: ep_rank -1.
    if (ep_rank >= 0) g.bytes += sync::trainer::contributed_bytes(param, tp, tp_rank, ep_rank);
    full += param.byte_count();
  }
  if (g.end_param > g.first_param) groups_.push_back(g);
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    for (std::size_t p = groups_[i].first_param; p < groups_[i].end_param; ++p) {
      for (const auto& part : params_[p].parts) group_of_.emplace(part.name, i);
    }
  }
}

void StageGather::lay_out() {
  // Zero-filled, so every page is written now: on a virtual machine a page costs its first
  // write (docs/performance.md), which made the first step's gather 4-5 s for 1 GiB.
  std::vector<sync::TensorMeta> metas;
  for (const auto& param : params_)
    metas.insert(metas.end(), param.parts.begin(), param.parts.end());
  arena_ = sync::trainer::TensorArena(metas, sync::kDefaultBucketAlignment, shared_arena_);
  digests_.resize(metas.size());  // never resized again: views_ point into it
  for (std::size_t i = 0; i < metas.size(); ++i) {
    spans_.push_back(arena_[i]);
    views_.push_back({metas[i], arena_[i], &digests_[i]});
  }
}

void StageGather::share_tensors(bool shared) {
  WC_ENFORCE(views_.empty(), "share_tensors() after the tensors were laid out");
  shared_arena_ = shared;
}

void StageGather::prepare(int stage_ranks) {
  if (views_.empty() && !params_.empty()) lay_out();
  if (stage_ranks <= 1) return;
  // What one gatherv brings from the other ranks, at most: a group's bytes less the source's.
  std::size_t most = 0;
  for (const Group& g : groups_) {
    std::size_t full = 0;
    for (std::size_t p = g.first_param; p < g.end_param; ++p) full += params_[p].byte_count();
    most = std::max(most, full - std::min(full, g.bytes));
  }
  if (received_.data.size() < most) received_.data.resize(most);
}

StageGather::~StageGather() {
  if (thread_.joinable()) thread_.join();
}

void StageGather::gather_all(MPI_Comm stage, const std::vector<std::byte>& mine,
                             comm::Deadline deadline) {
  const auto start = comm::Clock::now();
  int ranks = 0;
  MPI_Comm_size(stage, &ranks);
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    WC_ENFORCE_LE(g.offset + g.bytes, mine.size(), "shard bytes of group ", i);
    // Stage rank tp_rank + tp * dp_rank: the first tp * ep blocks are the EP ranks' shards. The
    // source's own (block 0) is read in place: it sends an empty one, and alone in its stage it
    // calls no gatherv at all. The others land in the buffer the previous groups and steps
    // received into (gatherv_bytes: reuse).
    std::vector<std::span<const std::byte>> blocks{std::span(mine).subspan(g.offset, g.bytes)};
    if (ranks > 1) {
      received_ = comm::mpi::gatherv_bytes(stage, 0, {}, deadline, std::move(received_));
      for (int r = 1; r < tp_ * ep_; ++r) blocks.push_back(received_.block(r));
    }
    sync::trainer::assemble_hf_into(
        std::span(params_).subspan(g.first_param, g.end_param - g.first_param), blocks, tp_,
        std::span<const std::span<std::byte>>(spans_).subspan(g.first_tensor,
                                                              g.end_tensor - g.first_tensor),
        std::span(digests_).subspan(g.first_tensor, g.end_tensor - g.first_tensor));
    {
      std::lock_guard lock(mu_);
      filled_ = i + 1;
    }
    cv_.notify_all();
  }
  std::lock_guard lock(mu_);
  gather_seconds_ = comm::seconds_since(start);
}

void StageGather::start(MPI_Comm stage, Shards mine, comm::Deadline deadline, bool threaded) {
  WC_ENFORCE(mine != nullptr, "start() needs the source's shard bytes");
  WC_ENFORCE(!thread_.joinable(), "finish() the previous step first");
  prepare(1);  // where the caller did not (the tensors are reused step after step)
  {
    std::lock_guard lock(mu_);
    filled_ = 0;
    error_ = nullptr;
    gather_seconds_ = 0;
    await_seconds_ = 0;
  }
  if (!threaded) {
    gather_all(stage, *mine, deadline);
    return;
  }
  thread_ = std::thread([this, stage, mine = std::move(mine), deadline] {
    try {
      gather_all(stage, *mine, deadline);
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  });
}

void StageGather::contribute(MPI_Comm stage, const Shards& mine, comm::Deadline deadline) {
  for (const Group& g : groups_) {
    // Each group's slice goes out in place (a copy into fresh memory cost more than the
    // transfer); the gather keeps `mine` alive for as long as MPI may read it.
    std::span<const std::byte> send;
    if (mine && !mine->empty()) {
      WC_ENFORCE_LE(g.offset + g.bytes, mine->size(), "shard bytes of a gather group");
      send = std::span<const std::byte>(*mine).subspan(g.offset, g.bytes);
    }
    comm::mpi::gatherv_bytes(stage, 0, mine, send, deadline);
  }
}

void StageGather::await(const std::string& name, comm::Deadline deadline) {
  const auto it = group_of_.find(name);
  if (it == group_of_.end()) throw comm::ConfigError("no tensor '" + name + "' in this stage");
  std::unique_lock lock(mu_);
  if (filled_ <= it->second && error_ == nullptr) {
    const auto start = comm::Clock::now();
    cv_.wait_until(lock, deadline, [&] { return filled_ > it->second || error_ != nullptr; });
    await_seconds_ += comm::seconds_since(start);
  }
  if (filled_ > it->second) return;
  if (error_) std::rethrow_exception(error_);
  throw comm::TimeoutError("tensor '" + name + "' was not gathered in time");
}

StageGather::Seconds StageGather::seconds() {
  std::lock_guard lock(mu_);
  return {gather_seconds_, await_seconds_};
}

void StageGather::finish() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace weightcast::launcher::train

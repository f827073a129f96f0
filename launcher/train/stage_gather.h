// StageGather: one training step's TP (and EP) shards of a pipeline stage, gathered to the stage
// source and converted into its HF tensors, in groups (an MPI gatherv per group).
//
// The groups are consecutive Megatron params of at most `group_bytes` (a larger param is a group
// of its own), the same on every rank: each rank cuts its shard bytes (rank_shards(): the params
// back to back) into the same groups and every rank of the stage communicator calls one gatherv
// per group, in order. Every rank sends its slices in place; the source reads its own in place
// and receives the others into one buffer kept from group to group and step to step (fresh
// receive memory made the gather an order of magnitude slower: docs/performance.md). With
// `group_bytes` SIZE_MAX (`--tp-gather whole`, the default) the whole stage is one group,
// gathered before the update opens. With about a bucket (`overlap`) the source runs the groups
// on a thread of its own (start()) while it broadcasts the buckets already gathered; await()
// blocks until a tensor is filled. Every other rank contributes in its calling thread
// (contribute()). Without MPI_THREAD_MULTIPLE the source gathers every group inside start()
// instead. With expert parallelism the stage's first `ep` data-parallel replicas are its EP
// ranks: each TP rank of EP rank p contributes the experts p holds (rank_shards() with ep_rank
// p), EP rank 0 the dense params too. Lifetime: one per rank, reused step after step (tensors and
// receive buffer stay allocated; prepare() allocates them at setup); finish() joins the step's
// thread. Threading: prepare/start/contribute/finish from the rank's main thread, await() from
// any thread.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/deadline.h"
#include "comm/mpi/mpi_helpers.h"
#include "sync/trainer/megatron.h"
#include "sync/trainer/tensor_arena.h"
#include "sync/trainer/tensors.h"

namespace weightcast::launcher::train {

class StageGather {
 public:
  // `params`: the stage's, experts of every EP rank included (every rank passes the same);
  // `tp_rank` and `ep_rank` this rank's (ep_rank -1 for the data-parallel replicas past the EP
  // ranks, which send empty blocks), `ep` the EP size.
  StageGather(std::vector<sync::trainer::MegatronParam> params, int tp, int tp_rank, int ep,
              int ep_rank, std::size_t group_bytes);
  ~StageGather();
  StageGather(const StageGather&) = delete;
  StageGather& operator=(const StageGather&) = delete;

  // A rank's shard bytes (rank_shards()), shared with the gather's MPI operations, which read
  // them in place and may outlive the call after a timeout.
  using Shards = std::shared_ptr<const std::vector<std::byte>>;

  // Source, at setup: allocates and writes the stage's HF tensors and, with `stage_ranks` > 1,
  // the receive buffer, so that the first step costs what the others do.
  void prepare(int stage_ranks);
  // Source, at setup, before prepare(): whether the tensors live in a memfd segment, which the
  // colocated path sends as it is (huge pages otherwise, which the chain reads fastest).
  void share_tensors(bool shared);
  // Source: gathers `mine` (this rank's rank_shards()) and every other rank's blocks group by
  // group into tensors(), on a thread when `threaded`, else before returning.
  void start(MPI_Comm stage, Shards mine, comm::Deadline deadline, bool threaded);
  // Any other rank of the stage: sends `mine` (null or empty for dp > 0 replicas) group by group.
  void contribute(MPI_Comm stage, const Shards& mine, comm::Deadline deadline);
  // Source: returns once the tensor `name` is filled; rethrows the gather's error; throws
  // comm::TimeoutError when `deadline` passes first, comm::ConfigError for an unknown name.
  void await(const std::string& name, comm::Deadline deadline);
  // Source: joins the step's thread and rethrows its error (a gather that timed out leaves the
  // stage communicator unusable: the caller ends the job, as for any MPI timeout).
  void finish();

  // Source, after finish(): how long the step's gather took (generation not included: it is
  // the caller's), and how long the sender's threads waited in await(), summed over threads.
  struct Seconds {
    double gather = 0;
    double await = 0;
  };
  Seconds seconds();

  // Source: the stage's HF tensors, in order, views of one TensorArena (so the buckets go out
  // without packing); complete once finish() returned. Each carries its digest
  // (NamedTensor::digest), made as the gather wrote the tensor, so the sender does not hash the
  // stage again; both are there once await() returned for the tensor.
  const std::vector<sync::trainer::NamedTensor>& tensors() const { return views_; }
  std::size_t groups() const { return groups_.size(); }

 private:
  // arena_, spans_ and views_ for params_, in the memory share_tensors() chose.
  void lay_out();
  struct Group {
    std::size_t first_param = 0, end_param = 0;    // params [first, end)
    std::size_t first_tensor = 0, end_tensor = 0;  // HF tensors [first, end)
    std::size_t offset = 0, bytes = 0;             // this rank's slice of its shard bytes
  };
  void gather_all(MPI_Comm stage, const std::vector<std::byte>& mine, comm::Deadline deadline);

  const std::vector<sync::trainer::MegatronParam> params_;
  const int tp_;
  const int ep_;
  std::vector<Group> groups_;
  sync::trainer::TensorArena arena_;               // the stage's HF tensors (prepare())
  bool shared_arena_ = false;                      // arena_ in a memfd segment
  std::vector<std::span<std::byte>> spans_;        // arena_'s tensors, written by the gather
  std::vector<sync::trainer::NamedTensor> views_;  // the same, read by the sender
  std::vector<sync::Digest> digests_;  // each tensor's, written with it; views_ point here
  std::unordered_map<std::string, std::size_t> group_of_;  // HF tensor name -> group
  comm::mpi::GatheredBytes received_;  // the source's receive buffer, reused group after group

  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t filled_ = 0;  // groups [0, filled_) are in the arena
  std::exception_ptr error_;
  double gather_seconds_ = 0;
  double await_seconds_ = 0;
  std::thread thread_;
};

}  // namespace weightcast::launcher::train

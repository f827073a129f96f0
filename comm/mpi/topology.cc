#include "comm/mpi/topology.h"

#include "comm/errors.h"

namespace weightcast::comm::mpi {

namespace {

int checked_dp_size(int world_size, int tp_size, int pp_size) {
  WC_ENFORCE_GE(world_size, 1, "world size must be positive");
  WC_ENFORCE_GE(tp_size, 1, "tensor-parallel size must be positive");
  WC_ENFORCE_GE(pp_size, 1, "pipeline-parallel size must be positive");
  // 64-bit product: tp and pp come from the command line and may be absurd.
  const long long grid = static_cast<long long>(tp_size) * pp_size;
  WC_ENFORCE_EQ(world_size % grid, 0LL, "world size ", world_size,
                " is not a multiple of tp * pp = ", tp_size, " * ", pp_size, " = ", grid);
  return static_cast<int>(world_size / grid);
}

}  // namespace

Topology::Topology(int world_rank, int world_size, int tp_size, int pp_size)
    : world_rank_(world_rank),
      world_size_(world_size),
      tp_size_(tp_size),
      pp_size_(pp_size),
      dp_size_(checked_dp_size(world_size, tp_size, pp_size)) {
  WC_ENFORCE_GE(world_rank, 0, "world rank must not be negative");
  WC_ENFORCE_LT(world_rank, world_size, "world rank must be below the world size");
  tp_rank_ = world_rank % tp_size_;
  dp_rank_ = (world_rank / tp_size_) % dp_size_;
  pp_rank_ = world_rank / (tp_size_ * dp_size_);
}

int Topology::stage_source(int pp_rank) const {
  return world_rank_of(0, 0, pp_rank);
}

int Topology::world_rank_of(int tp_rank, int dp_rank, int pp_rank) const {
  WC_ENFORCE_GE(tp_rank, 0);
  WC_ENFORCE_LT(tp_rank, tp_size_, "tp rank out of range");
  WC_ENFORCE_GE(dp_rank, 0);
  WC_ENFORCE_LT(dp_rank, dp_size_, "dp rank out of range");
  WC_ENFORCE_GE(pp_rank, 0);
  WC_ENFORCE_LT(pp_rank, pp_size_, "pp rank out of range");
  return tp_rank + tp_size_ * (dp_rank + dp_size_ * pp_rank);
}

}  // namespace weightcast::comm::mpi

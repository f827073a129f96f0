// Topology: where a trainer rank sits in the tensor (TP), data (DP) and pipeline (PP) parallel
// grid, in Megatron's default order (TP fastest, then DP, then PP):
//
//   world_rank = tp_rank + tp * (dp_rank + dp * pp_rank),   dp = world_size / (tp * pp)
//
// Each PP stage has one source rank (tp_rank == 0, dp_rank == 0); it gathers the stage's shards
// and broadcasts them to the engines.
// Lifetime: a value type; pure arithmetic, no MPI, so it is usable (and tested) without mpirun.
// Threading: immutable after construction; share freely.
#pragma once

namespace weightcast::comm::mpi {

class Topology {
 public:
  // Throws EnforceError (with both values) when tp or pp is < 1, world_rank is outside
  // [0, world_size), or world_size is not a multiple of tp * pp.
  Topology(int world_rank, int world_size, int tp_size, int pp_size);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int tp_size() const { return tp_size_; }
  int pp_size() const { return pp_size_; }
  int dp_size() const { return dp_size_; }

  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return dp_rank_; }
  int pp_rank() const { return pp_rank_; }

  // Ranks of one PP stage: tp_size * dp_size of them. This rank's index among them is
  // tp_rank + tp_size * dp_rank, which puts the stage source at index 0.
  int stage_size() const { return tp_size_ * dp_size_; }
  int rank_in_stage() const { return tp_rank_ + tp_size_ * dp_rank_; }

  bool is_stage_source() const { return tp_rank_ == 0 && dp_rank_ == 0; }

  // World rank of the source of stage `pp_rank` (of this rank's stage without an argument).
  int stage_source(int pp_rank) const;
  int stage_source() const { return stage_source(pp_rank_); }

  // World rank of the grid cell (tp_rank, dp_rank, pp_rank); each must be in range.
  int world_rank_of(int tp_rank, int dp_rank, int pp_rank) const;

 private:
  int world_rank_;
  int world_size_;
  int tp_size_;
  int pp_size_;
  int dp_size_;
  int tp_rank_;
  int dp_rank_;
  int pp_rank_;
};

}  // namespace weightcast::comm::mpi

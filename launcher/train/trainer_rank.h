// One rank of weightcast-train: its Megatron shards of one pipeline stage, and, on stage
// sources, the engine side of each update.
//
// Roles (comm::mpi::Topology, Megatron order): every rank generates its TP shard of its stage's
// tensors for the step; each stage's source (tp 0, dp 0) gathers them, converts them to HF
// tensors and broadcasts them on its group "<prefix>-pp_<stage>". World rank 0, the stage-0
// source, coordinates: it decides the selector, opens the session on every engine, and commits
// or aborts. Stages send one after another — stage s starts only after stage s-1 published its
// outcome to all sources over MPI — so no engine sees two groups' collectives interleaved.
// Every wait between ranks is bounded (comm/mpi helpers); an MPI timeout ends the job with
// MPI_Abort. The coordinator finally broadcasts the step's status line to every rank, so all
// ranks exit with the same code.
// Lifetime: one per process, after the MpiGuard. Threading: the MPI calling thread only.
#pragma once

#include <cstdio>

#include "launcher/train/train_options.h"

namespace weightcast::launcher::train {

enum ExitCode : int {
  kExitOk = 0,
  kExitUpdateFailed = 1,  // an update or its verification failed
  kExitConfig = 2,        // bad flags, model or engines that cannot honour the selector
  kExitInternal = 3,
};

// Runs setup and every step; returns this rank's exit code. Progress lines go to `out` on
// world rank 0 only.
int run_trainer(const TrainOptions& options, std::FILE* out);

}  // namespace weightcast::launcher::train

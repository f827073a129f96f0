// weightcast-train: trainer ranks that push a synthetic model's weights to rollout engines, one
// update per training step.
//
//   mpirun -np 4 weightcast-train --tp 2 --pp 2 --steps 3 --verify
//       --engines http://127.0.0.1:30000,http://127.0.0.1:30001
//
// N = tp * pp * dp ranks. Each holds its TP shard of its pipeline stage; each stage's source
// gathers, converts and broadcasts on its own group. World rank 0 prints one line per step:
//
//   step 1/3 version 1 selector target bytes 3145728 (3.0 MiB) buckets 2 seconds 0.041 ...
//
// docs/trainer.md describes every flag and how to run it beside a real training job.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"
#include "launcher/malloc_tuning.h"
#include "launcher/train/train_options.h"
#include "launcher/train/trainer_rank.h"

int main(int argc, char** argv) {
  weightcast::launcher::tune_malloc_for_updates();  // launcher/malloc_tuning.h
  using namespace weightcast::launcher::train;
  CLI::App app{"weightcast-train: push trainer weights to rollout engines (run under mpirun)"};
  TrainOptions options;
  add_options(app, options);
  CLI11_PARSE(app, argc, argv);
  try {
    // Every rank checks the same flags before MPI starts, so a bad value fails them all alike.
    check_model_layout(options, resolve_model(options));
    updater_options(options, {});
  } catch (const std::exception& e) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr || std::string(rank) == "0") {
      std::fprintf(stderr, "weightcast-train: %s\n", e.what());
    }
    return kExitConfig;
  }

  weightcast::comm::mpi::MpiGuard mpi(&argc, &argv);
  int code = kExitInternal;
  try {
    if (mpi.world_size() % (options.tp * options.pp) != 0) {
      throw weightcast::comm::ConfigError(
          "mpirun -np " + std::to_string(mpi.world_size()) +
          " is not a multiple of tp * pp = " + std::to_string(options.tp * options.pp));
    }
    const int dp = mpi.world_size() / (options.tp * options.pp);
    if (dp % options.ep != 0) {
      throw weightcast::comm::ConfigError(
          "--ep " + std::to_string(options.ep) + " does not divide the data-parallel size " +
          std::to_string(dp) + " (mpirun -np " + std::to_string(mpi.world_size()) + " / (tp " +
          std::to_string(options.tp) + " * pp " + std::to_string(options.pp) + "))");
    }
    code = run_trainer(options, stdout);
  } catch (const weightcast::comm::TimeoutError& e) {
    // A rank missed a collective: its peers are stuck in it, so end the whole job.
    std::fprintf(stderr, "weightcast-train: rank %d: %s\n", mpi.world_rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitInternal);
  } catch (const weightcast::comm::ConfigError& e) {
    if (mpi.world_rank() == 0) std::fprintf(stderr, "weightcast-train: %s\n", e.what());
    code = kExitConfig;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-train: rank %d: %s\n", mpi.world_rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitInternal);
  }
  return code;
}

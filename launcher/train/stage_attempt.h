// StageAttempt: one attempt at a step's update across weightcast-train's stage sources. The
// coordinator (world rank 0) opens the session and hands its token to the other sources; each
// stage then sends its tensors in turn, its outcome broadcast to every source before the next
// stage starts (no engine sees two groups' collectives interleaved); the coordinator records each
// outcome and commits or aborts; with --verify every stage's sent digests go to the coordinator
// after the commit. Every wait between sources is bounded by the stage budget.
// Lifetime: one per attempt, borrowing the rank's parts. Threading: the MPI calling thread only.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/mpi/mpi_helpers.h"
#include "launcher/train/rank_messages.h"
#include "launcher/train/stage_gather.h"
#include "launcher/train/train_options.h"
#include "sync/trainer/stage_outcome.h"
#include "sync/trainer/updater.h"
#include "sync/trainer/verify.h"

namespace weightcast::launcher::train {

// The longest a source may spend on one stage's data phase, group setup included.
comm::Millis stage_budget(const TrainOptions& o);

// An adapter step (--lora-rank; docs/lora.md): the attempt's session is an adapter session of
// `begin`'s adapter, committing the adapter's `version`; its tensors are ready, not gathered.
struct AdapterStep {
  sync::LoraBegin begin;
  std::string version;
};

class StageAttempt {
 public:
  StageAttempt(const TrainOptions& o, const comm::mpi::Topology& topo, MPI_Comm sources,
               sync::trainer::DistributedUpdater& updater, StageGather& gather,
               const AdapterStep* adapter = nullptr)
      : o_(o),
        topo_(topo),
        sources_(sources),
        updater_(updater),
        gather_(gather),
        adapter_(adapter) {}

  // Runs the attempt. Returns the coordinator's "opened" status; `report` and `digests` are the
  // coordinator's; `verify_seconds` gets the digest exchange's time when there was one.
  RankStatus run(const std::vector<sync::trainer::NamedTensor>& tensors,
                 sync::trainer::UpdateReport& report,
                 std::vector<sync::trainer::SentDigest>& digests, double& verify_seconds);

 private:
  bool coordinator() const { return topo_.world_rank() == 0; }
  comm::Deadline deadline() const;
  // This source's stage on the session: its engine set adopted, its group, its buckets.
  sync::trainer::StageOutcome send_own_stage(
      const std::optional<sync::trainer::UpdateSession>& session,
      const std::vector<sync::trainer::NamedTensor>& tensors);
  // --verify: every stage's sent digests to the coordinator (`digests`), after the commit.
  void exchange_digests(const std::vector<sync::trainer::NamedTensor>& tensors,
                        std::vector<sync::trainer::SentDigest>& digests, double& seconds);

  const TrainOptions& o_;
  const comm::mpi::Topology& topo_;
  MPI_Comm sources_;
  sync::trainer::DistributedUpdater& updater_;
  StageGather& gather_;
  const AdapterStep* adapter_;  // null: the base weights
};

}  // namespace weightcast::launcher::train

// WeightsChecker: SGLang's POST /weights_checker, over the runners' digests.
//
// Actions (SGLang's names): "checksum" answers each runner's combined digest of the bytes it
// holds now (recomputed, so memory changed behind the engine's back shows); "snapshot" records
// them; "compare" recomputes and answers 400 naming every runner that differs from the snapshot
// (or when none was taken). SGLang's "reset_tensors" (overwrite every weight with noise) is
// refused: nothing in weightcast should destroy committed weights on request.
// Lifetime: owned by the EngineReaders. Threading: thread-safe (its own lock; the runners lock
// their own state).
#pragma once

#include <map>
#include <mutex>

#include "sync/engine/control/reply.h"
#include "sync/engine/runners/runner.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

class WeightsChecker {
 public:
  Reply handle(const RunnerSet& runners, const WeightsCheckerRequest& request);

 private:
  std::mutex mu_;
  std::map<Runner, Digest> snapshot_;
  std::string snapshot_version_;
};

}  // namespace weightcast::sync::engine

// An Engine in the test process with small target and draft runners, for tests that need the
// engine's route table or want to call its handlers directly (no sockets). `connector` replaces
// the data plane, so tests can count connection attempts.
// Lifetime: the Engine owns its runners; destroy it before anything its connector refers to.
// Threading: as Engine.
#pragma once

#include <memory>
#include <utility>

#include "sync/engine/control/engine.h"
#include "sync/engine/runners/weights.h"

namespace weightcast::security {

inline std::unique_ptr<sync::engine::Engine> make_inprocess_engine(
    sync::engine::EngineOptions opts = {}) {
  using namespace sync;
  using namespace sync::engine;
  RunnerConfig target{Runner::kTarget, NameFilter::parse("model.*"), Layout::kShuffle, {}, 0,
                      "generated"};
  RunnerConfig draft{Runner::kDraft, NameFilter::parse("mtp.*"), Layout::kShuffle, {}, 0,
                     "generated"};
  auto runners = std::make_unique<RunnerSet>(std::vector<RunnerConfig>{target, draft}, "v0", 1);
  runners->load_initial(Runner::kTarget,
                        generate_weights({{"model.a", DType::kBFloat16, {32, 64}}}, 1));
  runners->load_initial(Runner::kDraft,
                        generate_weights({{"mtp.fc", DType::kBFloat16, {16, 64}}}, 1));
  return std::make_unique<Engine>(std::move(opts), std::move(runners));
}

}  // namespace weightcast::security

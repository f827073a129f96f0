// SentRecord: what the last committed update sent (per-tensor digests for every layout), and the
// check of the engines' /weights_checksum against it.
//
// A Python trainer's initial weights are not generated from a seed, so unlike the launcher's
// UpdateVerifier this checks only the tensors the update sent: every runner the session's
// selector covers and whose filter accepts a name must hold layout(runner)(bytes sent), under
// the committed weight_version. Engines without /weights_checksum (SGLang) are skipped and listed.
// Lifetime/threading: plain values; record() needs no GIL (the bytes are borrowed for the call).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "sync/protocol/protocol.h"
#include "sync/protocol/selector.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/tensors.h"
#include "sync/trainer/verify.h"

namespace weightcast::python {

class SentRecord {
 public:
  bool empty() const { return version_.empty(); }
  void record(sync::Selector selector, std::string version,
              std::span<const sync::trainer::NamedTensor> tensors);
  // The same, from digests computed where the tensors are (each pipeline stage's source).
  void record(sync::Selector selector, std::string version,
              std::vector<sync::trainer::SentDigest> digests);

  // One line per problem, naming engine, runner and tensor; empty when every engine agrees.
  // `infos[i]` is /server_info of engines[i].
  std::vector<std::string> check(std::span<sync::trainer::EngineApi* const> engines,
                                 const std::vector<sync::ServerInfoResponse>& infos) const;

  // Engines the last check() skipped (no checksum route).
  const std::vector<std::string>& unverifiable() const { return unverifiable_; }

 private:
  std::vector<std::string> check_runner(const std::string& url, const sync::RunnerInfo& runner,
                                        const sync::WeightsChecksumResponse& answer) const;

  sync::Selector selector_ = sync::Selector::kAll;
  std::string version_;
  std::vector<sync::trainer::SentDigest> sent_;
  mutable std::vector<std::string> unverifiable_;
};

}  // namespace weightcast::python

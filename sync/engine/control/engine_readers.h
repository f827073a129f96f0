// EngineReaders: the engine's routes that read its state — health, server info (also SGLang's
// /get_server_info keys), weight version and model info, per-runner checksums, Prometheus
// metrics, the speculative accept-length probe — and the weights checker, which compares the
// committed weights with a snapshot. None changes a weight or a session.
// Lifetime: a part of the Engine (one of its bases). Threading: thread-safe.
#pragma once

#include <string>

#include "sync/engine/commit/weights_checker.h"
#include "sync/engine/control/engine_context.h"
#include "sync/engine/control/reply.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

class EngineReaders {
 public:
  explicit EngineReaders(EngineContext& ctx) : ctx_(ctx) {}

  Reply health() const;
  Reply server_info() const;
  Reply weight_version_info() const;
  Reply model_info() const;
  Reply weights_checksum(const std::string& runner, bool recompute = false) const;
  // /weights_checksum?lora=NAME: the adapter's per-tensor digests and combined digest; 404 when no
  // adapter of that name is held (docs/lora.md).
  Reply lora_checksum(const std::string& name) const;
  Reply metrics() const;
  // The speculative accept-length probe (sync/model/spec_probe.h) on the committed weights, each
  // read through its runner's layout: the target's embedding and lm_head, the draft's EAGLE fc.
  // Cached per (weight_version, digests); 409 when the engine holds no EAGLE-style draft.
  Reply spec_accept_length() const;
  Reply weights_checker(const WeightsCheckerRequest& request);

 private:
  EngineContext& ctx_;
  WeightsChecker checker_;
};

}  // namespace weightcast::sync::engine

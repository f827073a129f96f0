// Gloo backend: host-memory broadcast over Gloo's TCP transport.
//
// The group is formed by gloo::rendezvous::Context::connectFullMesh through an adapter from our
// Store (so rendezvous honours our timeouts and token). broadcast() is a pipelined chain over
// Gloo unbound buffers: ranks ordered from the root, each link carrying chunk_bytes chunks with
// chunks_in_flight outstanding, so every link runs at once and the root's link is not divided by
// the receiver count (unlike gloo::broadcast, which is one-to-all).
// Lifetime/threading: as Communicator. This header does not include Gloo.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weightcast::comm {

class GlooCommunicator : public Communicator {
 public:
  // Stock gloo::broadcast (one-to-all) on the same group, for benchmarks only.
  virtual void broadcast_stock(const BroadcastOptions& opts) = 0;
};

// Rendezvouses and returns a GlooCommunicator. Throws TimeoutError when the group does not form
// within opts.timeout, ConfigError when opts.bind_address cannot be bound.
std::unique_ptr<GlooCommunicator> create_gloo_communicator(const CommOptions& opts);

}  // namespace weightcast::comm

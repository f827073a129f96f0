// Gloo backend: host-memory broadcast over Gloo's TCP transport.
//
// The group is formed by gloo::rendezvous::Context::connectFullMesh through an adapter from our
// Store (so rendezvous honours our timeouts and token). broadcast() is a pipelined chain over
// Gloo unbound buffers: ranks ordered from the root, each link carrying chunk_bytes chunks with
// chunks_in_flight outstanding, so every link runs at once and the root's link is not divided by
// the receiver count (unlike gloo::broadcast, which is one-to-all).
//
// Failures: a deadline that passes gives TimeoutError, a connection the collective still needs
// that closes or resets gives PeerError naming the rank; either aborts the communicator (its
// sockets are closed, so peers learn at once; after a timeout the eager ring's connection to the
// successor stays open until abort() or destruction, so the ranks behind time out themselves
// instead of reporting the closure as a peer failure). A watchdog thread, active only during
// collectives, notices dead connections that Gloo itself reports only at the deadline.
// A peer that closes after it is done (its communicator destroyed) does not fail collectives
// that no longer need it.
// Process state: creating a communicator sets SIGPIPE to ignored when it is at its default
// (Gloo writes with writev(2); a vanished peer must be a PeerError, not a dead process).
// Lifetime/threading: as Communicator. This header does not include Gloo.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weightcast::comm {

class GlooCommunicator : public Communicator {
 public:
  // Stock gloo::broadcast (one-to-all) on the same group, for benchmarks only.
  virtual void broadcast_stock(const BroadcastOptions& opts) = 0;
  // Whether the group agreed on same-host single copy for its eager broadcasts
  // (SingleCopyOptions::enabled).
  virtual bool single_copy() const = 0;
};

// Rendezvouses and returns a GlooCommunicator. Returns only once every rank has connected, so a
// rank may destroy its communicator right away without breaking a slower peer's rendezvous.
// Throws TimeoutError when the group does not form within opts.timeout, ConfigError when
// opts.bind_address cannot be bound or opts.chunk_bytes differs from rank 0's (the chain needs
// one chunk size per group), PeerError when a peer fails while connecting.
std::unique_ptr<GlooCommunicator> create_gloo_communicator(const CommOptions& opts);

}  // namespace weightcast::comm

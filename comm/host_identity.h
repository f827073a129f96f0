// host_identity(): who "the same host" is, for the transports that only work there.
//
// "<boot id>/<net ns>/<pid ns>/<uid>": two processes with equal identities run on one booted
// kernel, in one network namespace (so they reach each other's abstract unix sockets), in one pid
// namespace (so they see each other's pids) and as one user (so they may read each other's memory
// and pass descriptors). Same-host single copy (comm/transport/peer_memory.h) and the colocated
// path (comm/colocate/, docs/colocated.md) both compare it. Empty when any part cannot be read.
// Threading: reads /proc; safe from any thread.
#pragma once

#include <string>

namespace weightcast::comm {

std::string host_identity();

}  // namespace weightcast::comm

// The colocated path as a broadcast backend of weightcast-bench broadcast ("colocate"): the
// root writes the bytes once into a sealed memfd segment (comm/colocate/segment.h), hands its
// read-only descriptor to every other rank once at setup (comm/colocate/segment_server.h), and
// each broadcast is the root's copy into the segment and every other rank's copy out of its
// read-only mapping, then a barrier (so the next write never overlaps a read). All ranks
// must share the host. Up to 4 MiB the root writes, all wait at a barrier, the others read;
// above, the root writes in 1 MiB chunks and publishes its progress in the
// segment's first page after each; the others copy each chunk out as soon as it is written
// (pipelined, as MPI's shared-memory broadcast is). The engine's route also hashes each chunk in
// the copy's pass; this backend times the copy alone, as the other rows time the transport alone.
// Lifetime/threading: the returned function holds the segment and mapping; call it from the
// rank's thread, on every rank together, as the other backends.
#pragma once

#include <cstddef>
#include <functional>

#include "comm/deadline.h"

namespace weightcast::launcher {

// Throws comm::ConfigError when the root is not rank 0 at call time or `bytes` exceeds
// `max_bytes`, comm::Error when the segment cannot be handed over within `timeout`.
std::function<void(void*, std::size_t, int)> colocated_broadcast(int rank, int size,
                                                                 std::size_t max_bytes,
                                                                 comm::Millis timeout);

}  // namespace weightcast::launcher

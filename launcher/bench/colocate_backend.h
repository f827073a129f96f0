// The colocated path as a broadcast backend of weightcast-bench broadcast ("colocate"): the
// root writes the bytes once into a sealed memfd segment (comm/colocate/segment.h), hands its
// read-only descriptor to every other rank once at setup (comm/colocate/segment_server.h), and
// each broadcast is the root's copy into the segment and every other rank's copy out of its
// read-only mapping, then a barrier (so the next write never overlaps a read). All ranks
// must share the host. Up to 4 MiB the root writes, all wait at a barrier, the others read;
// above, the root writes in 1 MiB chunks and publishes its progress in the
// segment's first page after each; the others copy each chunk out as soon as it is written
// (pipelined, as MPI's shared-memory broadcast is). The engine's route also hashes each chunk in
// the copy's pass; "colocate" times the copy alone, as the other rows time the transport alone,
// and "colocate-hash" (`hash`) the copy with every reader hashing each chunk while it is in cache
// (sync/model/checksum.h's Hasher, as the engine's route does): the two rows apart are what the
// digests cost the colocated update. "colocate-arena" (`in_place`) is the route as the trainer
// runs it: the root's bytes already live in the segment (its TensorArena is the segment), so the
// root copies nothing and every reader copies once, as in MPI's shared-memory broadcast, which
// reads the root's buffer in place (CMA). "colocate-arena-hash" is both: the colocated update's
// data plane as it runs. "colocate-arena-map-hash" (`from_mapping`) reads with memcpy out of the
// reader's own mapping of the segment, kept from setup on, instead of pread: what an engine that
// kept the trainer's segment mapped across updates would do (docs/colocated.md, "Why the update
// stays under 0.8x the raw chain").
// Lifetime/threading: the returned run holds the segment and mapping (root_buffer points into
// them); call it from the rank's thread, on every rank together, as the other backends.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string_view>

#include "comm/deadline.h"

namespace weightcast::launcher {

struct ColocatedBroadcast {
  // The broadcast of `bytes` bytes at `p` from `root`. With in_place, the root passes
  // root_buffer (where its bytes already are); the others pass their own buffers.
  std::function<void(void*, std::size_t, int)> run;
  // The root's buffer inside the segment (in_place only, rank 0 only; else null).
  void* root_buffer = nullptr;
};

struct ColocatedBackendOptions {
  bool hash = false;          // readers hash each chunk in the copy's pass
  bool in_place = false;      // the root's bytes live in the segment (root_buffer)
  bool from_mapping = false;  // readers memcpy out of their mapping instead of pread
};

// The backend named `name` (colocate, colocate-hash, colocate-arena, colocate-arena-hash,
// colocate-arena-map-hash), or nullopt for any other name.
std::optional<ColocatedBackendOptions> colocated_backend_options(std::string_view name);

// Throws comm::ConfigError when the root is not rank 0 at call time or `bytes` exceeds
// `max_bytes`, comm::Error when the segment cannot be handed over within `timeout`.
ColocatedBroadcast colocated_broadcast(int rank, int size, std::size_t max_bytes,
                                       comm::Millis timeout, ColocatedBackendOptions options);

}  // namespace weightcast::launcher

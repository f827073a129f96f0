// MPI helpers for trainer ranks: MPI's lifetime (MpiGuard), the TP / DP / PP-stage
// sub-communicators of a Topology (Comm), and collectives whose every wait is bounded by a
// deadline (gatherv_bytes, barrier, broadcast_string).
//
// Only trainer code (launched by mpirun) includes this header; engines never depend on MPI.
//
// Bounded waits: each collective is posted non-blocking (MPI_Igather, MPI_Ibarrier, ...) and
// polled with MPI_Test until it completes or its deadline passes. On timeout it throws
// TimeoutError naming the operation and the communicator size. MPI has no way to cancel a
// collective, so the operation stays pending: its buffers are kept alive ("stranded") and it
// is still driven to completion should the late peers arrive, which lets a test finish
// cleanly. The communicator's collective sequence is broken after a timeout — never use it
// again. The trainer's answer to a TimeoutError is MPI_Abort, which ends every rank.
//
// Lifetime: one MpiGuard per process, created first and destroyed last (after every Comm).
// Threading: MPI is asked for MPI_THREAD_MULTIPLE; when it provides less (see
// MpiGuard::thread_level()), call these helpers from one thread at a time, the thread that
// created the guard when the level is MPI_THREAD_FUNNELED or below.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/huge_pages.h"
#include "comm/mpi/topology.h"

namespace weightcast::comm::mpi {

class MpiGuard {
 public:
  // Initializes MPI unless it already is (then this guard neither initializes nor finalizes).
  // `drain_timeout` bounds how long the destructor waits for stranded operations before
  // finalizing; if some are still pending then, it calls MPI_Abort rather than hang in
  // MPI_Finalize. Throws ConfigError when MPI was already finalized.
  MpiGuard(int* argc, char*** argv, Millis drain_timeout = Millis(10000));
  MpiGuard() : MpiGuard(nullptr, nullptr) {}
  ~MpiGuard();
  MpiGuard(const MpiGuard&) = delete;
  MpiGuard& operator=(const MpiGuard&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // What MPI provided: MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE.
  int thread_level() const { return thread_level_; }
  bool thread_multiple() const { return thread_level_ == MPI_THREAD_MULTIPLE; }
  bool owns_mpi() const { return owns_; }

 private:
  bool owns_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  int world_rank_ = -1;
  int world_size_ = 0;
  Millis drain_timeout_;
};

// An owned communicator, freed on destruction (a no-op after MPI_Finalize). Move-only.
class Comm {
 public:
  Comm() = default;
  explicit Comm(MPI_Comm comm) : comm_(comm) {}  // takes ownership
  ~Comm();
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  MPI_Comm get() const { return comm_; }
  explicit operator bool() const { return comm_ != MPI_COMM_NULL; }
  int rank() const;
  int size() const;
  // MPI_COMM_WORLD rank of each member, indexed by rank in this communicator.
  std::vector<int> world_ranks() const;

 private:
  void reset();
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Collective over `parent`: a copy with its own collective sequence (MPI_Comm_idup, bounded).
Comm duplicate(MPI_Comm parent, Deadline deadline);

// Collective over `parent`: MPI_Comm_split. MPI has no non-blocking split, so a bounded barrier
// runs first; once every rank has passed it, the split waits on no one.
Comm split(MPI_Comm parent, int color, int key, Deadline deadline);

// Collective over `comm`: whether its ranks run on more than one host, as the MPI runtime places
// them (MPI_COMM_TYPE_SHARED). Every rank gets the same answer. A bounded barrier runs first.
bool spans_hosts(MPI_Comm comm, Deadline deadline);

// Sub-communicators of `world` (whose size must be topo.world_size()), each a collective over
// `world` that every rank calls in the same order. Ranks inside are ordered so that rank 0 is
// tp_rank 0 (tp group), dp_rank 0 (dp group), the stage source (stage group).
Comm tp_group(const Topology& topo, MPI_Comm world, Deadline deadline);
Comm dp_group(const Topology& topo, MPI_Comm world, Deadline deadline);
// All tp_size * dp_size ranks of this rank's PP stage: the ones whose shards its source
// gathers. Rank in it = topo.rank_in_stage().
Comm stage_group(const Topology& topo, MPI_Comm world, Deadline deadline);

// What gatherv_bytes delivers on the root: every rank's block, back to back, in rank order.
struct GatheredBytes {
  HugePageBytes data;  // huge pages: MPI receives into fresh ones ~12x faster (comm/huge_pages.h)
  std::vector<std::size_t> offsets;  // size() + 1 entries; block r is [offsets[r], offsets[r+1])

  int size() const { return offsets.empty() ? 0 : static_cast<int>(offsets.size() - 1); }
  std::span<const std::byte> block(int rank) const;
};

// Collective over `comm`: gathers each rank's `send` on `root` (block sizes may differ and may
// be zero; they are exchanged first). Returns the blocks on the root, an empty result elsewhere.
// `send` is taken by value because MPI may still read it after a timeout.
// `reuse` (root only): a result of an earlier call whose buffer receives this one's blocks, so a
// caller that gathers step after step writes into memory that has already received (with Open
// MPI's shared-memory transport, receiving into new memory is what made the trainer's EP gather
// slow: docs/performance.md, "The stage gather, fixed"). The buffer only grows; `data` may then
// be longer than the blocks (offsets.back() is their end).
// Throws EnforceError for a root out of range or a block or block offset above INT_MAX bytes
// (MPI counts and displacements are int), TimeoutError when `deadline` passes.
GatheredBytes gatherv_bytes(MPI_Comm comm, int root, std::vector<std::byte> send, Deadline deadline,
                            GatheredBytes reuse = {});
// The same without copying the block: `send` lies in memory that `owner` keeps alive (the
// operation holds `owner` until MPI is done reading, past a timeout if need be). A block that
// is a slice of a larger buffer goes out in place, instead of through a fresh copy whose pages
// are written for the first time (measured: the copy, not the transfer, was most of a group).
GatheredBytes gatherv_bytes(MPI_Comm comm, int root, std::shared_ptr<const void> owner,
                            std::span<const std::byte> send, Deadline deadline,
                            GatheredBytes reuse = {});

// Collective over `comm`: returns once every rank has entered. Throws TimeoutError.
void barrier(MPI_Comm comm, Deadline deadline);

// Collective over `comm`: returns root's `value` on every rank (`value` is ignored elsewhere).
// For small strings — a store address, a token — of at most kMaxBroadcastStringBytes.
// Throws EnforceError for a root out of range or an oversized value, TimeoutError.
inline constexpr std::size_t kMaxBroadcastStringBytes = 1u << 20;
std::string broadcast_string(MPI_Comm comm, int root, std::string value, Deadline deadline);

// Operations abandoned by a timeout that MPI has not completed yet. Every helper above drives
// them while it polls; drain_stranded() polls only them until none is left or `deadline`
// passes, and returns how many are left.
std::size_t stranded_operations();
std::size_t drain_stranded(Deadline deadline);

}  // namespace weightcast::comm::mpi

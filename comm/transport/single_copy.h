// Same-host single copy for the chain's eager ring: when every member of a group runs on one host,
// a receiver copies a broadcast straight out of its predecessor's buffer with process_vm_readv(2)
// (Linux cross-memory attach, the mechanism Open MPI's shared-memory transport uses) instead of the
// bytes passing through every socket of the ring.
//
// Why: on one host the TCP ring copies every byte twice per hop (into the kernel and out again),
// and a middle rank does both for every byte it forwards; MPI_Bcast between processes of one host
// copies each byte once per receiver. With single copy the ring's sockets carry only a 40-byte
// descriptor per broadcast (sequence, root, byte count, the sender's buffer address), one lap ahead
// of the copies; the root copies nothing.
//
// How, as a pipelined chain in ring order from the root: each member publishes in its control page
// (comm/transport/peer_memory.h) how much of its buffer holds the broadcast, piece by piece as it
// copies, and its successor copies each piece once it is there. A member returns once its
// successor holds every byte (the last member: once it does), so a member's buffer is read only
// while it is inside the broadcast, and back-to-back broadcasts overlap down the chain as MPI's
// pipelined broadcast does. No completion lap: waits on a neighbour spin briefly, then sleep on a
// futex in its page, and wake on its next store.
//
// Safety: a member marks that it vouches for its buffer (in_use) with the broadcast's sequence
// number, and clears the mark before it returns, on success or failure. A receiver reads the mark
// after its copy and before it publishes its last piece: if its predecessor no longer vouches, it
// may have left (timed out, aborted) and reused its buffer during the copy, and the receiver fails
// instead of returning bytes it cannot vouch for; its own successor then fails the same way. A
// neighbour that exits is seen through its ring socket (hung up), one that stops through the
// deadline.
//
// Threading: as EagerRing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "comm/transport/peer_memory.h"

namespace weightcast::comm::gloo_backend {

// One rank's view of the ring's two connections, for a single-copy broadcast.
struct RingLinks {
  int rank = 0;
  int size = 0;
  int pred_fd = -1;  // from rank - 1
  int succ_fd = -1;  // to rank + 1
  int wake_fd = -1;  // readable once the ring was interrupted
};

// One single-copy broadcast of [data, data + bytes) from `root`, numbered `sequence`, as this rank
// takes part in it. Throws LinkFailure or WaitInterrupted as EagerRing::broadcast. A receiver
// calls `on_received` (if set) with each piece once it copied and published it.
void single_copy_broadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                           std::size_t bytes, int root, std::uint64_t sequence, Deadline deadline,
                           const ReceivedFn& on_received = {});

// The ring's agreement when it forms: true when every member passes usable == true. One byte-sized
// message a lap, two laps; bounded by `deadline` (TimeoutError, PeerError on a closed link).
bool ring_agree(const RingLinks& links, bool usable, Deadline deadline);

}  // namespace weightcast::comm::gloo_backend

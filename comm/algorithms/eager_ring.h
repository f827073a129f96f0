// The chain's small-buffer transport: one TCP connection from every rank to the next, carrying
// broadcasts below the group's eager threshold without Gloo.
//
// Below ~16 MiB the chain over Gloo unbound buffers loses to MPI_Bcast: every chunk's send waits
// for the receiver's "ready" message and a hand-off to Gloo's I/O thread on both sides, a cost per
// message rather than per byte (docs/performance.md has the profile). The ring has neither: a
// broadcast is a 32-byte header and the payload written straight onto the socket (eager, no
// rendezvous), and each rank progresses its own links in the calling thread. A middle rank reads
// what its predecessor sent and forwards every piece to its successor as soon as it has it, in one
// poll loop, so the links run at the same time as in the chunked chain.
//
// The header (magic, sequence number, root, byte count) is checked by every receiver, so ranks
// that disagree on a collective fail with a message naming both sides instead of mixing streams.
//
// On one host the ring can do better than sockets: when the members agreed on single copy
// (comm/transport/single_copy.h), broadcasts of at least SingleCopyOptions::min_bytes, of any size,
// are copied by every receiver straight out of its predecessor's memory, down the chain, and the
// ring carries only a descriptor; the communicator then sends those sizes here even above its eager
// threshold.
//
// Rendezvous: every rank listens on the group's bind address, publishes "<host>:<port>" under
// "chain/eager/<rank>" in the group's store, connects to rank + 1 and accepts rank - 1 (each
// connection opens with a hello naming the connecting rank, checked by the acceptor). Both ring
// neighbours are distinct connections, also in a group of two.
//
// Failures: a broadcast throws LinkFailure (peer_gone when the connection closed or reset, or
// timed_out when the deadline passed) or WaitInterrupted after interrupt(). After any failure the
// stream is in an unknown state: the owner must call shut_down() and not broadcast again.
// Lifetime: owned by its communicator; sockets close on destruction.
// Threading: broadcast() on one thread at a time; interrupt() and shut_down() from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "comm/transport/peer_memory.h"
#include "comm/transport/single_copy_options.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm::gloo_backend {

class GlooStoreAdapter;

class EagerRing {
 public:
  // Forms the ring over `store` (the group's rendezvous adapter) within `deadline`. Throws
  // ConfigError when bind_address cannot be bound, TimeoutError when a neighbour does not show up.
  // With copy.enabled, the members also probe whether they can read one another's memory
  // (comm/transport/single_copy.h) and agree on it.
  static std::unique_ptr<EagerRing> connect(GlooStoreAdapter& store, int rank, int size,
                                            const std::string& bind_address,
                                            const SingleCopyOptions& copy, Deadline deadline);

  // `memory` null: every broadcast goes through the sockets.
  EagerRing(int rank, int size, net::Fd to_succ, net::Fd from_pred,
            std::unique_ptr<PeerMemory> memory = nullptr);
  ~EagerRing();
  EagerRing(const EagerRing&) = delete;
  EagerRing& operator=(const EagerRing&) = delete;

  // Whether broadcasts of at least SingleCopyOptions::min_bytes are copied straight out of the
  // root's memory (every member on one host, and they agreed) rather than sent through the sockets.
  bool single_copy() const { return memory_ != nullptr; }
  // Whether a broadcast of `bytes` is copied out of the root's memory; such broadcasts take the
  // ring at any size, since on one host nothing is faster.
  bool copies(std::size_t bytes) const {
    return memory_ && bytes >= single_copy_min_ && bytes <= kMaxCopyBytes;
  }

  // Broadcasts [data, data + bytes) from `root` down the ring, bounded by `deadline`.
  // `on_received` (optional): BroadcastOptions::on_received, called per piece under single copy
  // (copies(bytes)) only; the caller reports a socket broadcast itself.
  void broadcast(std::uint8_t* data, std::size_t bytes, int root, Deadline deadline,
                 const ReceivedFn& on_received = {});

  // Makes the broadcast in flight (and every later one) return with WaitInterrupted.
  void interrupt();
  // Shuts both connections down, so the neighbours learn at once; the fds stay open until
  // destruction, so a broadcast still polling them sees an error rather than a reused fd.
  void shut_down();
  // Shuts down the connection from the predecessor only.
  void shut_down_upstream();

 private:
  int rank_;
  int size_;
  net::Fd to_succ_;
  net::Fd from_pred_;
  std::unique_ptr<PeerMemory> memory_;
  std::size_t single_copy_min_ = 0;
  net::Fd wake_;  // eventfd, readable once interrupt() was called
  std::uint64_t sequence_ = 0;
};

}  // namespace weightcast::comm::gloo_backend

// Same-host single copy for the chain's eager ring: when every member of a group runs on one host,
// a receiver copies a broadcast straight out of the root's buffer with process_vm_readv(2) (Linux
// cross-memory attach, the mechanism Open MPI's shared-memory transport uses) instead of the bytes
// passing through every socket of the ring.
//
// Why: on one host the TCP ring copies every byte twice per hop (into the kernel and out again),
// and a middle rank does both for every byte it forwards; MPI_Bcast between processes of one host
// copies each byte once per receiver. With single copy the ring carries only a 40-byte descriptor
// (sequence, root, byte count, the root's buffer address) one lap ahead of the copies, and a
// 16-byte completion token one lap behind them; the receivers copy at the same time, the root
// copies nothing.
//
// When: every member publishes its host identity (boot id, network and PID namespaces, user) and
// a random token in its memory under "chain/copy/<rank>"; each member reads every other member's
// token through process_vm_readv and compares it. The ring then agrees (a logical AND in one lap,
// the result in a second lap), so either every member copies or none does; a member on another
// host, in another network namespace (the bench's simulated hosts), with the option off, or whose
// kernel refuses the read, turns it off for the whole group, and broadcasts keep the TCP ring.
//
// Safety: the root marks its buffer in use with the broadcast's sequence number in a word of its
// own memory, and clears it before it returns, on success or failure. A receiver reads that word
// after its copy: if it no longer holds the sequence number, the root may have left (timed out,
// aborted) and reused its buffer during the copy, and the receiver fails instead of returning
// bytes it cannot vouch for.
//
// Lifetime: PeerMemory is owned by the ring and must outlive every broadcast; its token and word
// are read by the other members' processes. Threading: as EagerRing.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"

namespace weightcast::comm::gloo_backend {

class GlooStoreAdapter;

// The other members' processes and where their marks live, found when the group forms.
class PeerMemory {
 public:
  // Publishes this rank's identity (or "off" when !enabled) and reads every other member's token.
  // The result's usable() says whether every read succeeded; the ring must agree before using it.
  static std::unique_ptr<PeerMemory> probe(GlooStoreAdapter& store, int rank, int size,
                                           bool enabled);

  explicit PeerMemory(int size);
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  bool usable() const { return usable_; }

  // This rank's in-use word; kIdle when no broadcast of this rank's buffer is in flight.
  static constexpr std::uint64_t kIdle = ~std::uint64_t{0};
  std::atomic<std::uint64_t>& in_use() { return in_use_; }

  // Copies [remote, remote + bytes) of rank `peer`'s memory into `local`. Returns 0, or the errno
  // of the failed read.
  int read(int peer, void* local, std::uint64_t remote, std::size_t bytes) const;
  // Reads rank `peer`'s in-use word into *value. Returns 0 or an errno.
  int read_in_use(int peer, std::uint64_t* value) const;

 private:
  bool check_peer(const std::string& mine, int peer, const std::string& published);

  struct Peer {
    pid_t pid = 0;
    std::uint64_t in_use_addr = 0;
  };
  std::vector<Peer> peers_;
  alignas(64) std::atomic<std::uint64_t> in_use_{kIdle};
  std::array<std::uint8_t, 16> token_{};
  bool usable_ = false;
};

// One rank's view of the ring's two connections, for a single-copy broadcast.
struct RingLinks {
  int rank = 0;
  int size = 0;
  int pred_fd = -1;  // from rank - 1
  int succ_fd = -1;  // to rank + 1
  int wake_fd = -1;  // readable once the ring was interrupted
};

// One single-copy broadcast of [data, data + bytes) from `root`, numbered `sequence`, as this rank
// takes part in it. Throws LinkFailure or WaitInterrupted as EagerRing::broadcast.
void single_copy_broadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                           std::size_t bytes, int root, std::uint64_t sequence, Deadline deadline);

// The ring's agreement when it forms: true when every member passes usable == true. One byte-sized
// message a lap, two laps; bounded by `deadline` (TimeoutError, PeerError on a closed link).
bool ring_agree(const RingLinks& links, bool usable, Deadline deadline);

}  // namespace weightcast::comm::gloo_backend

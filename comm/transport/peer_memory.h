// What the members of an eager ring on one host share for single-copy broadcasts
// (comm/transport/single_copy.h): the right to read one another's memory with process_vm_readv(2),
// and a page of control words per member that its two ring neighbours map.
//
// When the group forms, every member creates its control page (a memfd), publishes its host
// identity (boot id, network and PID namespaces, user), its pid, the page's fd number and a random
// token written in the page under "chain/copy/<rank>", and then:
// - reads every other member's token through process_vm_readv, which proves that it may read that
//   member's memory and that the pid names that member as this process sees it;
// - maps its predecessor's and its successor's control pages through /proc/<pid>/fd/<fd> and
//   checks their tokens, so that the words it waits on are really theirs.
// usable() is true when all of that succeeded; the ring must still agree (ring_agree) so that
// either every member copies or none does. A member on another host, in another network
// namespace (the bench's simulated hosts), with the option off, or refused by the kernel, turns
// single copy off for the whole group, and broadcasts keep the TCP ring.
//
// The control words are lock-free atomics in shared memory, so a neighbour's loads and stores are
// ordered with this rank's as between threads. A rank that waits for a word to change spins, then
// sleeps on a futex in the same page; a rank that changes a word wakes its sleepers.
//
// Lifetime: owned by the ring; the pages stay mapped until the ring goes, even if a neighbour's
// process has exited. Threading: as EagerRing.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weightcast::comm::gloo_backend {

class GlooStoreAdapter;

// The progress word: the sequence number modulo 2^24 over the byte count (< 2^40). Neighbours are
// never more than one broadcast apart, so 24 bits tell them apart.
constexpr int kProgressShift = 40;
constexpr std::uint64_t kSequenceMask = 0xffffff;
constexpr std::uint64_t kMaxCopyBytes = (std::uint64_t{1} << kProgressShift) - 1;
inline std::uint64_t progress_word(std::uint64_t sequence, std::uint64_t bytes) {
  return ((sequence & kSequenceMask) << kProgressShift) | bytes;
}
// Whether `word` counts bytes of broadcast `sequence`.
inline bool progress_of(std::uint64_t word, std::uint64_t sequence) {
  return (word >> kProgressShift) == (sequence & kSequenceMask);
}
inline std::uint64_t progress_bytes(std::uint64_t word) {
  return word & kMaxCopyBytes;
}

// A futex word that changes after the stores it announces, and the count of members asleep on it.
struct WakeWord {
  std::atomic<std::uint32_t> bump{0};
  std::atomic<std::uint32_t> sleepers{0};
};

// One member's control page, as every process that maps it sees it.
struct CopyControl {
  static constexpr std::uint64_t kIdle = ~std::uint64_t{0};

  std::array<std::uint8_t, 16> token{};
  // The sequence number of the broadcast whose bytes this member vouches for (as root: its buffer
  // holds them and stays unchanged; as receiver: its copy came from a member that vouched for it),
  // or kIdle between broadcasts and once it left one.
  alignas(64) std::atomic<std::uint64_t> in_use{kIdle};
  // progress_word(sequence, n): the first n bytes of this member's buffer hold the broadcast's.
  // Starts at sequence 2^24 - 1, which no neighbour takes for collective #0 or #1.
  std::atomic<std::uint64_t> progress{progress_word(kSequenceMask, 0)};
  // `any` changes after every store above, `end` only after those that end something (the last
  // byte held, in_use set or cleared), so that a neighbour waiting for the end is not woken by
  // every piece.
  alignas(64) WakeWord any;
  WakeWord end;

  WakeWord& wake(bool final) { return final ? end : any; }
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

class PeerMemory {
 public:
  // Publishes this rank's identity (or "off" when !enabled), reads every other member's token and
  // maps its neighbours' control pages.
  static std::unique_ptr<PeerMemory> probe(GlooStoreAdapter& store, int rank, int size,
                                           bool enabled);

  PeerMemory(int rank, int size);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  bool usable() const { return usable_; }

  CopyControl& mine() { return *mine_; }
  // The control page of this rank's predecessor or successor on the ring.
  CopyControl& neighbour(int peer);

  // Stores `value` in one of this rank's words and wakes the neighbours asleep on its `any` word,
  // and with `final` those asleep on its `end` word too.
  void publish(std::atomic<std::uint64_t>& word, std::uint64_t value, bool final);
  // Sleeps until `peer`'s page's wake(final) word changes after `seen` (as read before the check
  // that found nothing new), or `slice` passes.
  void sleep_on(int peer, bool final, std::uint32_t seen, std::chrono::microseconds slice);

  // Copies [remote, remote + bytes) of rank `peer`'s memory into `local`. Returns 0, or the errno
  // of the failed read.
  int read(int peer, void* local, std::uint64_t remote, std::size_t bytes) const;

 private:
  bool check_peer(const std::string& mine, int peer, const std::string& published);
  bool map_neighbour(int peer);

  struct Peer {
    pid_t pid = 0;
    int fd = -1;                  // its control page's fd number in its process
    CopyControl* page = nullptr;  // mapped here, for the two neighbours only
    std::string token;            // as it published it, in hex
  };
  int rank_, size_;
  std::vector<Peer> peers_;
  int fd_ = -1;  // this rank's memfd
  CopyControl* mine_ = nullptr;
  bool usable_ = false;
};

}  // namespace weightcast::comm::gloo_backend

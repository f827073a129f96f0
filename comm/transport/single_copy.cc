#include "comm/transport/single_copy.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/errors.h"
#include "comm/transport/link_failure.h"
#include "comm/transport/ring_wire.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm::gloo_backend {
namespace {

constexpr std::array<char, 8> kDescriptorMagic = {'w', 'c', 'b', 'c', 'o', 'p', 'y', '2'};
constexpr std::array<char, 4> kAgreeMagic = {'w', 'c', 's', 'c'};
// magic, u64 sequence, u32 root, u32 zero, u64 bytes, u64 address of the sender's buffer
constexpr std::size_t kDescriptorBytes = RingHeader::kBytes + 8;
constexpr std::size_t kAgreeBytes = 8;  // magic, u32 flag
// A receiver copies and publishes its progress in pieces of a quarter of the broadcast, within
// these bounds: its successor trails it by one piece, and pieces above 1 MiB measured slower from
// 64 MiB (docs/performance.md). It checks its deadline and interrupt between pieces.
constexpr std::size_t kPieces = 4;
constexpr std::size_t kMinPiece = 256u << 10;
constexpr std::size_t kMaxPiece = 1u << 20;
// A wait on a neighbour's page yields this many times before it sleeps on the page's futex, in
// slices of kSleepSlice; the message is usually microseconds away, and a sleep's wake-up costs
// tens of them on a busy host (docs/performance.md).
constexpr int kSpinYields = 200;
constexpr std::chrono::microseconds kSleepSlice{2000};

// Where other work holds the cores, a yield can hand the core away for a whole scheduler slice
// (milliseconds), not microseconds: with two busy loops beside 3 ranks on 2 cores, broadcasts of
// 256 KiB and 1 MiB took a median 4.1 ms by yielding, 0.17 and 0.41 ms with this policy
// (docs/performance.md, "Single copy beside other work"). A yield that comes back after
// kLateYieldNs marks the process contended for kContendedForNs, and its waits sleep at once until
// then. A shorter yield most likely ran a peer rank's copy on this core, which is what the spin
// is for.
class SpinPolicy {
 public:
  // Whether a wait may start by yielding.
  static bool spinning() { return now_ns() >= spin_from_.load(std::memory_order_relaxed); }

  // Yields once; false when the yield came back late, and the wait should sleep from now on.
  static bool yield() {
    const std::int64_t before = now_ns();
    std::this_thread::yield();
    const std::int64_t after = now_ns();
    if (after - before < kLateYieldNs) return true;
    spin_from_.store(after + kContendedForNs, std::memory_order_relaxed);
    return false;
  }

 private:
  static constexpr std::int64_t kLateYieldNs = 1'000'000;
  static constexpr std::int64_t kContendedForNs = 10'000'000;

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  static inline std::atomic<std::int64_t> spin_from_{0};
};

// While spinning, the deadline, the interrupt and the neighbour's socket are checked this often.
constexpr int kCheckEvery = 32;

std::size_t piece_bytes(std::size_t bytes) {
  const std::size_t share = (bytes / kPieces + 0xffff) & ~std::size_t{0xffff};
  return std::clamp(share, kMinPiece, kMaxPiece);
}

// The ring's header (comm/transport/ring_wire.h) under the magic wcbcopy2, then the address of the
// sender's buffer (u64): the root's for the first receiver, each receiver's own for the next.
struct Descriptor {
  RingHeader head;
  std::uint64_t address = 0;

  void encode(std::uint8_t* out) const {
    head.encode(out, kDescriptorMagic);
    put_le(out + RingHeader::kBytes, address, 8);
  }
  bool decode(const std::uint8_t* in) {
    if (!head.decode(in, kDescriptorMagic)) return false;
    address = get_le(in + RingHeader::kBytes, 8);
    return true;
  }
};

// Marks this rank's buffer as vouched for by broadcast `sequence`, and clears the mark however
// the broadcast ends.
class InUseMark {
 public:
  InUseMark(PeerMemory& memory, std::uint64_t sequence) : memory_(memory) {
    memory_.publish(memory_.mine().in_use, sequence, true);
  }
  ~InUseMark() { memory_.publish(memory_.mine().in_use, CopyControl::kIdle, true); }
  InUseMark(const InUseMark&) = delete;
  InUseMark& operator=(const InUseMark&) = delete;

 private:
  PeerMemory& memory_;
};

// One rank's part in a single-copy broadcast: the descriptor, the pipelined copy out of the
// predecessor, the wait for the successor.
class CopyBroadcast {
 public:
  CopyBroadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                const RingHeader& expected, Deadline deadline, const ReceivedFn& on_received)
      : links_(links),
        memory_(memory),
        data_(data),
        expected_(expected),
        deadline_(deadline),
        on_received_(on_received) {
    root_ = static_cast<int>(expected.root);
    const int pos = (links.rank - root_ + links.size) % links.size;
    pred_ = (links.rank - 1 + links.size) % links.size;
    succ_ = (links.rank + 1) % links.size;
    last_ = pos == links.size - 1;
    is_root_ = pos == 0;
  }

  void run() {
    if (is_root_) {
      if (net::peer_hung_up(links_.succ_fd))
        fail(succ_, "starting the broadcast", "the connection was closed", true);
      InUseMark mark(memory_, expected_.sequence);
      memory_.publish(memory_.mine().progress, progress_word(expected_.sequence, expected_.bytes),
                      true);
      send_descriptor();
      wait_for_successor();
      return;
    }
    std::array<std::uint8_t, kDescriptorBytes> wire{};
    receive(wire.data(), wire.size(), "the descriptor of ");
    Descriptor got;
    if (!got.decode(wire.data())) {
      fail(pred_, "waiting for the descriptor", "the stream does not hold a descriptor", false);
    }
    if (!(got.head == expected_)) {
      fail(pred_, "checking the descriptor", expected_.refuse(pred_, got.head), false);
    }
    InUseMark mark(memory_, expected_.sequence);
    memory_.publish(memory_.mine().progress, progress_word(expected_.sequence, 0), false);
    if (!last_) send_descriptor();
    copy(got.address);
    if (!last_) wait_for_successor();
  }

 private:
  void send_descriptor() {
    const Descriptor d{expected_, reinterpret_cast<std::uintptr_t>(data_)};
    std::array<std::uint8_t, kDescriptorBytes> wire{};
    d.encode(wire.data());
    send(wire.data(), wire.size(), "the descriptor of ");
  }

  // Copies the broadcast out of the predecessor's buffer at `address`, each piece once the
  // predecessor has it, publishing this rank's own progress after each.
  void copy(std::uint64_t address) {
    CopyControl& pred = memory_.neighbour(pred_);
    const std::uint64_t sequence = expected_.sequence;
    const std::size_t piece = piece_bytes(expected_.bytes);
    std::size_t done = 0;
    std::size_t reported = 0;  // bytes handed to on_received_
    while (done < expected_.bytes) {
      std::size_t ready = 0;
      await(false, [&] {
        const std::uint64_t word = pred.progress.load(std::memory_order_acquire);
        if (progress_of(word, sequence) && progress_bytes(word) > done) {
          ready = static_cast<std::size_t>(progress_bytes(word));
          return true;
        }
        if (pred.in_use.load(std::memory_order_acquire) != sequence) left(pred_, done);
        return false;
      });
      while (done < ready) {
        check_interrupt();
        if (expired(deadline_)) fail(pred_, copying(done), "timed out", false, true);
        const std::size_t len = std::min(piece, ready - done);
        const int err = memory_.read(pred_, data_ + done, address + done, len);
        if (err != 0) fail(pred_, copying(done), std::strerror(err), err == ESRCH);
        done += len;
        if (done < expected_.bytes) {
          memory_.publish(memory_.mine().progress, progress_word(sequence, done), false);
          // After publishing: the successor copies the piece while this rank reads it again.
          if (on_received_) on_received_(done - len, len);
          reported = done;
        }
      }
    }
    // The predecessor must still vouch for what was copied before the successor may finish.
    if (pred.in_use.load(std::memory_order_acquire) != sequence) left(pred_, done);
    memory_.publish(memory_.mine().progress, progress_word(sequence, done), true);
    // The last piece, once the successor may take it.
    if (on_received_ && done > reported) on_received_(reported, done - reported);
  }

  // Waits until the successor holds every byte (or has moved on to the next broadcast, which it
  // does only after this one), so that this rank's buffer is no longer read.
  void wait_for_successor() {
    CopyControl& succ = memory_.neighbour(succ_);
    const std::uint64_t sequence = expected_.sequence;
    await(true, [&] {
      const std::uint64_t word = succ.progress.load(std::memory_order_acquire);
      if (word == progress_word(sequence, expected_.bytes)) return true;
      if (progress_of(word, sequence + 1)) return true;
      if (progress_of(word, sequence) && succ.in_use.load(std::memory_order_acquire) != sequence) {
        fail(succ_, waiting_for(true),
             detail::concat("rank ", succ_, " left the broadcast after copying ",
                            progress_bytes(word), "/", expected_.bytes, " bytes"),
             true);
      }
      return false;
    });
  }

  // Spins, then sleeps, until ready() holds; waits on the successor with `all` (for it to hold
  // every byte), else on the predecessor (for more bytes). Checks the deadline, the interrupt and
  // whether that neighbour hung up its socket on the way.
  template <class Ready>
  void await(bool all, Ready ready) {
    const int peer = all ? succ_ : pred_;
    const int fd = all ? links_.succ_fd : links_.pred_fd;
    const WakeWord& wake = memory_.neighbour(peer).wake(all);
    bool sleeping = !SpinPolicy::spinning();
    for (int spins = 0;; ++spins) {
      const std::uint32_t seen = wake.bump.load(std::memory_order_acquire);
      if (ready()) return;
      sleeping = sleeping || spins >= kSpinYields;
      if (sleeping || spins % kCheckEvery == 0) {
        check_interrupt();
        if (expired(deadline_)) fail(peer, waiting_for(all), "timed out", false, true);
        if (net::peer_hung_up(fd)) fail(peer, waiting_for(all), "the connection was closed", true);
      }
      if (!sleeping) {
        sleeping = !SpinPolicy::yield();
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(remaining(deadline_));
      memory_.sleep_on(peer, all, seen,
                       std::clamp(left, std::chrono::microseconds{1}, kSleepSlice));
    }
  }

  [[noreturn]] void left(int peer, std::size_t done) const {
    fail(peer, copying(done),
         detail::concat(peer == root_ ? "the root" : "rank " + std::to_string(peer),
                        " left the broadcast before this rank had finished copying, so its buffer "
                        "may have changed under the copy"),
         true);
  }

  void send(std::uint8_t* p, std::size_t n, const char* what) { transfer(p, n, true, what); }
  void receive(std::uint8_t* p, std::size_t n, const char* what) { transfer(p, n, false, what); }

  // Moves n bytes to the successor (`out`) or from the predecessor, waiting while the socket is
  // full or empty.
  void transfer(std::uint8_t* p, std::size_t n, bool out, const char* what) {
    const int fd = out ? links_.succ_fd : links_.pred_fd;
    const int peer = out ? succ_ : pred_;
    int spins = 0;
    while (n > 0) {
      const ssize_t k =
          out ? ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : ::recv(fd, p, n, MSG_DONTWAIT);
      if (k == 0 && !out) fail(peer, doing(out, what), "the connection was closed", true);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      const int err = errno;
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        fail(peer, doing(out, what), std::strerror(err),
             err == EPIPE || err == ECONNRESET || err == ENOTCONN);
      }
      // The next descriptor is usually microseconds away: yield a bounded number of times before
      // sleeping in poll(). Yielding hands the core to any peer that is runnable, and the
      // deadline and abort are checked in wait().
      if (spins == 0 && !SpinPolicy::spinning()) spins = kSpinYields;
      if (++spins <= kSpinYields && SpinPolicy::yield()) continue;
      spins = 0;
      wait(fd, out, what);
    }
  }

  // Waits until the socket can move bytes in the direction of `out`; what the failure names is
  // only phrased when there is one.
  void wait(int fd, bool out, const char* what) {
    const int peer = out ? succ_ : pred_;
    std::array<pollfd, 2> fds{
        {{links_.wake_fd, POLLIN, 0}, {fd, static_cast<short>(out ? POLLOUT : POLLIN), 0}}};
    const int err = wait_ring(fds, deadline_);
    if (err == ETIMEDOUT) fail(peer, doing(out, what), "timed out", false, true);
    if (err != 0) fail(peer, doing(out, what), std::strerror(err), false);
  }

  void check_interrupt() const {
    pollfd fd{links_.wake_fd, POLLIN, 0};
    if (::poll(&fd, 1, 0) > 0) throw WaitInterrupted{};
  }

  std::string doing(bool out, const char* what) const {
    return detail::concat(out ? "sending " : "receiving ", what, expected_.describe(),
                          out ? " to rank " : " from rank ", out ? succ_ : pred_,
                          " (eager ring, single copy)");
  }
  std::string copying(std::size_t done) const {
    return detail::concat("copying ", done, "/", expected_.bytes, " bytes of ",
                          expected_.describe(), " out of rank ", pred_,
                          "'s memory (eager ring, single copy)");
  }
  std::string waiting_for(bool all) const {
    return detail::concat("waiting for rank ", all ? succ_ : pred_,
                          all ? " to hold all of " : " to hold more of ", expected_.describe(),
                          " (eager ring, single copy)");
  }

  [[noreturn]] void fail(int peer, const std::string& doing, const std::string& what, bool gone,
                         bool timed_out = false) const {
    throw LinkFailure{peer, doing, what, gone, timed_out};
  }

  const RingLinks& links_;
  PeerMemory& memory_;
  std::uint8_t* data_;
  RingHeader expected_;
  Deadline deadline_;
  const ReceivedFn& on_received_;  // may be empty
  int root_ = 0, pred_ = 0, succ_ = 0;
  bool last_ = false, is_root_ = false;
};

}  // namespace

void single_copy_broadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                           std::size_t bytes, int root, std::uint64_t sequence, Deadline deadline,
                           const ReceivedFn& on_received) {
  RingHeader expected;
  expected.sequence = sequence;
  expected.root = static_cast<std::uint32_t>(root);
  expected.bytes = bytes;
  CopyBroadcast(links, memory, data, expected, deadline, on_received).run();
}

bool ring_agree(const RingLinks& links, bool usable, Deadline deadline) {
  const int pred = (links.rank - 1 + links.size) % links.size;
  const int succ = (links.rank + 1) % links.size;
  auto send_flag = [&](bool flag) {
    std::array<char, kAgreeBytes> wire{};
    std::memcpy(wire.data(), kAgreeMagic.data(), kAgreeMagic.size());
    put_le(reinterpret_cast<std::uint8_t*>(wire.data()) + 4, flag ? 1 : 0, 4);
    const auto sent = net::send_all(links.succ_fd, {wire.data(), wire.size()}, deadline);
    if (sent.io == net::Io::kTimeout) {
      throw TimeoutError(detail::concat("eager ring: rank ", links.rank,
                                        " could not agree with rank ", succ, ": timed out"));
    }
    if (!sent.ok()) {
      throw PeerError(detail::concat("rank ", succ),
                      "eager ring: agreeing on single copy: " + sent.describe());
    }
  };
  auto receive_flag = [&]() {
    std::array<char, kAgreeBytes> wire{};
    const auto got = net::recv_exact(links.pred_fd, wire.data(), wire.size(), deadline);
    if (got.io == net::Io::kTimeout) {
      throw TimeoutError(detail::concat("eager ring: rank ", links.rank,
                                        " was not reached by rank ", pred, " when agreeing"));
    }
    if (!got.ok() || std::memcmp(wire.data(), kAgreeMagic.data(), kAgreeMagic.size()) != 0) {
      throw PeerError(detail::concat("rank ", pred),
                      "eager ring: agreeing on single copy: " +
                          (got.ok() ? "not an agreement message" : got.describe()));
    }
    return get_le(reinterpret_cast<const std::uint8_t*>(wire.data()) + 4, 4) == 1;
  };
  if (links.rank == 0) {
    send_flag(usable);
    const bool all = receive_flag();
    send_flag(all);
    (void)receive_flag();  // the result, back around: every member has it
    return all;
  }
  const bool so_far = receive_flag() && usable;
  send_flag(so_far);
  const bool all = receive_flag();
  send_flag(all);
  return all;
}

}  // namespace weightcast::comm::gloo_backend

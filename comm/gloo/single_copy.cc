#include "comm/gloo/single_copy.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "comm/errors.h"
#include "comm/gloo/gloo_chain.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "comm/gloo/ring_wire.h"
#include "comm/store/socket_io.h"

namespace weightcast::comm::gloo_backend {
namespace {

constexpr std::array<char, 8> kDescriptorMagic = {'w', 'c', 'b', 'c', 'o', 'p', 'y', '1'};
constexpr std::array<char, 8> kDoneMagic = {'w', 'c', 'b', 'd', 'o', 'n', 'e', '1'};
constexpr std::array<char, 4> kAgreeMagic = {'w', 'c', 's', 'c'};
// magic, u64 sequence, u32 root, u32 zero, u64 bytes, u64 address of the root's buffer
constexpr std::size_t kDescriptorBytes = RingHeader::kBytes + 8;
constexpr std::size_t kDoneBytes = 16;  // magic, u64 sequence
constexpr std::size_t kAgreeBytes = 8;  // magic, u32 flag
// A receiver copies in pieces of this size, checking its deadline and interrupt between them.
constexpr std::size_t kCopyPiece = 4u << 20;
// Yields before a wait for the ring's next message sleeps in poll() (CopyBroadcast::transfer).
constexpr int kSpinYields = 200;

std::string copy_key(int rank) {
  return "chain/copy/" + std::to_string(rank);
}

// "<boot id>/<net ns>/<pid ns>/<uid>": processes with equal identities see one another's pids and
// may read one another's memory; empty when any part cannot be read.
std::string host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id)) return {};
  std::ostringstream os;
  os << boot_id;
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/pid"}) {
    struct stat st {};
    if (::stat(ns, &st) != 0) return {};
    os << '/' << st.st_dev << ':' << st.st_ino;
  }
  os << '/' << ::getuid();
  return os.str();
}

std::string to_hex(const std::array<std::uint8_t, 16>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// The ring's header (comm/gloo/ring_wire.h) under the magic wcbcopy1, then the address of the
// root's buffer (u64).
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

// Clears the root's in-use word however the broadcast ends.
class InUseMark {
 public:
  InUseMark(std::atomic<std::uint64_t>& word, std::uint64_t sequence) : word_(word) {
    word_.store(sequence, std::memory_order_release);
  }
  ~InUseMark() { word_.store(PeerMemory::kIdle, std::memory_order_release); }
  InUseMark(const InUseMark&) = delete;
  InUseMark& operator=(const InUseMark&) = delete;

 private:
  std::atomic<std::uint64_t>& word_;
};

// One rank's part in a single-copy broadcast: the descriptor lap, the copy, the completion lap.
class CopyBroadcast {
 public:
  CopyBroadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                const RingHeader& expected, Deadline deadline)
      : links_(links), memory_(memory), data_(data), expected_(expected), deadline_(deadline) {
    root_ = static_cast<int>(expected.root);
    const int pos = (links.rank - root_ + links.size) % links.size;
    pred_ = (links.rank - 1 + links.size) % links.size;
    succ_ = (links.rank + 1) % links.size;
    first_ = pos == 1;
    last_ = pos == links.size - 1;
    is_root_ = pos == 0;
  }

  void run() {
    if (is_root_) {
      run_root();
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
    if (!last_) send(wire.data(), wire.size(), "the descriptor of ");
    copy(got.address);
    if (!first_) receive_done();
    send_done();
  }

 private:
  void run_root() {
    if (net::peer_hung_up(links_.succ_fd))
      fail(succ_, "starting the broadcast", "the connection was closed", true);
    InUseMark mark(memory_.in_use(), expected_.sequence);
    Descriptor d{expected_, 0};
    d.address = reinterpret_cast<std::uintptr_t>(data_);
    std::array<std::uint8_t, kDescriptorBytes> wire{};
    d.encode(wire.data());
    send(wire.data(), wire.size(), "the descriptor of ");
    receive_done();
  }

  void copy(std::uint64_t address) {
    std::size_t done = 0;
    while (done < expected_.bytes) {
      check_interrupt();
      if (expired(deadline_)) fail(root_, copying(done), "timed out", false, true);
      const std::size_t len = std::min<std::size_t>(kCopyPiece, expected_.bytes - done);
      const int err = memory_.read(root_, data_ + done, address + done, len);
      if (err != 0) fail(root_, copying(done), std::strerror(err), err == ESRCH);
      done += len;
    }
    std::uint64_t word = 0;
    const int err = memory_.read_in_use(root_, &word);
    if (err != 0) fail(root_, copying(done), std::strerror(err), err == ESRCH);
    if (word != expected_.sequence) {
      fail(root_, copying(done),
           "the root left the broadcast before this rank had finished copying, so its buffer may "
           "have changed under the copy",
           true);
    }
  }

  void receive_done() {
    std::array<std::uint8_t, kDoneBytes> wire{};
    receive(wire.data(), wire.size(), "the completion of ");
    if (std::memcmp(wire.data(), kDoneMagic.data(), kDoneMagic.size()) != 0 ||
        get_le(wire.data() + 8, 8) != expected_.sequence) {
      fail(pred_, "waiting for the completion",
           detail::concat("rank ", pred_, " sends another message than the completion of ",
                          expected_.describe()),
           false);
    }
  }

  void send_done() {
    std::array<std::uint8_t, kDoneBytes> wire{};
    std::memcpy(wire.data(), kDoneMagic.data(), kDoneMagic.size());
    put_le(wire.data() + 8, expected_.sequence, 8);
    send(wire.data(), wire.size(), "the completion of ");
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
      // The next descriptor or token is usually microseconds away (a peer finishing its copy):
      // yield a bounded number of times before sleeping in poll(), whose wake-up cost this
      // broadcast's latency at 1-16 MiB (docs/performance.md). Yielding hands the core to any
      // peer that is runnable, and the deadline and abort are checked in wait().
      if (++spins <= kSpinYields) {
        std::this_thread::yield();
        continue;
      }
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
    return detail::concat("copying ", done, "/", expected_.bytes, " bytes out of rank ", root_,
                          "'s memory (eager ring, single copy)");
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
  int root_ = 0, pred_ = 0, succ_ = 0;
  bool first_ = false, last_ = false, is_root_ = false;
};

}  // namespace

PeerMemory::PeerMemory(int size) : peers_(static_cast<std::size_t>(size)) {
  std::random_device random;
  for (auto& b : token_) b = static_cast<std::uint8_t>(random());
}

std::unique_ptr<PeerMemory> PeerMemory::probe(GlooStoreAdapter& store, int rank, int size,
                                              bool enabled) {
  auto memory = std::make_unique<PeerMemory>(size);
  const std::string identity = enabled ? host_identity() : std::string();
  std::ostringstream value;
  if (identity.empty()) {
    value << "off";
  } else {
    value << "v1 " << identity << ' ' << ::getpid() << ' '
          << reinterpret_cast<std::uintptr_t>(memory->token_.data()) << ' '
          << reinterpret_cast<std::uintptr_t>(&memory->in_use_) << ' ' << to_hex(memory->token_);
  }
  const std::string text = value.str();
  store.set(copy_key(rank), std::vector<char>(text.begin(), text.end()));
  if (identity.empty()) return memory;
  memory->usable_ = true;
  for (int peer = 0; peer < size && memory->usable_; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> got = store.get(copy_key(peer));
    memory->usable_ = memory->check_peer(identity, peer, std::string(got.begin(), got.end()));
  }
  memory->peers_[static_cast<std::size_t>(rank)] = {
      ::getpid(), reinterpret_cast<std::uintptr_t>(&memory->in_use_)};
  return memory;
}

bool PeerMemory::check_peer(const std::string& mine, int peer, const std::string& published) {
  std::istringstream in(published);
  std::string version, identity, token;
  long long pid = 0;
  std::uint64_t token_addr = 0, in_use_addr = 0;
  if (!(in >> version >> identity >> pid >> token_addr >> in_use_addr >> token) ||
      version != "v1" || identity != mine || pid <= 0) {
    return false;
  }
  peers_[static_cast<std::size_t>(peer)] = {static_cast<pid_t>(pid), in_use_addr};
  // The token is random per member: reading the bytes it published proves that the pid and the
  // addresses name that member's process, as this process sees it.
  std::array<std::uint8_t, 16> theirs{};
  return read(peer, theirs.data(), token_addr, theirs.size()) == 0 && to_hex(theirs) == token;
}

int PeerMemory::read(int peer, void* local, std::uint64_t remote, std::size_t bytes) const {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  auto* out = static_cast<std::uint8_t*>(local);
  while (bytes > 0) {
    iovec l{out, bytes};
    iovec r{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
    const ssize_t n = ::process_vm_readv(p.pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EFAULT;
    out += n;
    remote += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

int PeerMemory::read_in_use(int peer, std::uint64_t* value) const {
  return read(peer, value, peers_[static_cast<std::size_t>(peer)].in_use_addr, sizeof(*value));
}

void single_copy_broadcast(const RingLinks& links, PeerMemory& memory, std::uint8_t* data,
                           std::size_t bytes, int root, std::uint64_t sequence, Deadline deadline) {
  RingHeader expected;
  expected.sequence = sequence;
  expected.root = static_cast<std::uint32_t>(root);
  expected.bytes = bytes;
  CopyBroadcast(links, memory, data, expected, deadline).run();
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

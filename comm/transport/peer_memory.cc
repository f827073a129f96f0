#include "comm/transport/peer_memory.h"
#include "comm/hex.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <new>
#include <random>
#include <sstream>

#include "comm/errors.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "comm/host_identity.h"

namespace weightcast::comm::gloo_backend {
namespace {

constexpr std::size_t kPageBytes = 4096;
static_assert(sizeof(CopyControl) <= kPageBytes);

std::string copy_key(int rank) {
  return "chain/copy/" + std::to_string(rank);
}

// A shared mapping of a control page; nullptr on failure.
CopyControl* map_page(int fd) {
  void* p = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<CopyControl*>(p);
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the page is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr,
                   0);
}

}  // namespace

PeerMemory::PeerMemory(int rank, int size)
    : rank_(rank), size_(size), peers_(static_cast<std::size_t>(size)) {}

PeerMemory::~PeerMemory() {
  for (Peer& p : peers_) {
    if (p.page != nullptr && p.page != mine_) ::munmap(p.page, kPageBytes);
  }
  if (mine_ != nullptr) {
    mine_->~CopyControl();
    ::munmap(mine_, kPageBytes);
  }
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<PeerMemory> PeerMemory::probe(GlooStoreAdapter& store, int rank, int size,
                                              bool enabled) {
  auto memory = std::make_unique<PeerMemory>(rank, size);
  std::string identity = enabled ? host_identity() : std::string();
  if (!identity.empty()) {
    memory->fd_ = static_cast<int>(::memfd_create("weightcast-copy", MFD_CLOEXEC));
    void* page = nullptr;
    if (memory->fd_ >= 0 && ::ftruncate(memory->fd_, kPageBytes) == 0) page = map_page(memory->fd_);
    if (page == nullptr) {
      identity.clear();  // no control page, no single copy: the group keeps its sockets
    } else {
      memory->mine_ = new (page) CopyControl;
      std::random_device random;
      for (auto& b : memory->mine_->token) b = static_cast<std::uint8_t>(random());
    }
  }
  std::ostringstream value;
  if (identity.empty()) {
    value << "off";
  } else {
    value << "v2 " << identity << ' ' << ::getpid() << ' ' << memory->fd_ << ' '
          << reinterpret_cast<std::uintptr_t>(memory->mine_->token.data()) << ' '
          << to_hex(memory->mine_->token);
  }
  const std::string text = value.str();
  store.set(copy_key(rank), std::vector<char>(text.begin(), text.end()));
  if (identity.empty()) return memory;
  memory->peers_[static_cast<std::size_t>(rank)] = {::getpid(), memory->fd_, memory->mine_, {}};
  memory->usable_ = true;
  for (int peer = 0; peer < size && memory->usable_; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> got = store.get(copy_key(peer));
    memory->usable_ = memory->check_peer(identity, peer, std::string(got.begin(), got.end()));
  }
  if (memory->usable_ && size > 1) {
    memory->usable_ =
        memory->map_neighbour((rank + 1) % size) && memory->map_neighbour((rank - 1 + size) % size);
  }
  return memory;
}

bool PeerMemory::check_peer(const std::string& mine, int peer, const std::string& published) {
  std::istringstream in(published);
  std::string version, identity, token;
  long long pid = 0;
  int fd = -1;
  std::uint64_t token_addr = 0;
  if (!(in >> version >> identity >> pid >> fd >> token_addr >> token) || version != "v2" ||
      identity != mine || pid <= 0 || fd < 0) {
    return false;
  }
  peers_[static_cast<std::size_t>(peer)] = {static_cast<pid_t>(pid), fd, nullptr, token};
  // The token is random per member: reading the bytes it published proves that the pid and the
  // address name that member's process, as this process sees it, and that the kernel lets this
  // process read its memory.
  std::array<std::uint8_t, 16> theirs{};
  return read(peer, theirs.data(), token_addr, theirs.size()) == 0 && to_hex(theirs) == token;
}

bool PeerMemory::map_neighbour(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.page != nullptr) return true;  // a ring of two: the predecessor is the successor
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(p.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  p.page = map_page(fd);
  ::close(fd);
  // The page must hold the token the peer published, which check_peer found in its memory.
  return p.page != nullptr && to_hex(p.page->token) == p.token;
}

CopyControl& PeerMemory::neighbour(int peer) {
  CopyControl* page = peers_.at(static_cast<std::size_t>(peer)).page;
  WC_ENFORCE(page != nullptr, "rank ", peer, " is not a ring neighbour of rank ", rank_, " of ",
             size_);
  return *page;
}

void PeerMemory::publish(std::atomic<std::uint64_t>& word, std::uint64_t value, bool final) {
  word.store(value, std::memory_order_seq_cst);
  for (WakeWord* w : {&mine_->any, final ? &mine_->end : nullptr}) {
    if (w == nullptr) continue;
    w->bump.fetch_add(1, std::memory_order_seq_cst);
    if (w->sleepers.load(std::memory_order_seq_cst) != 0) {
      (void)futex(&w->bump, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }
}

void PeerMemory::sleep_on(int peer, bool final, std::uint32_t seen,
                          std::chrono::microseconds slice) {
  WakeWord& w = neighbour(peer).wake(final);
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (w.bump.load(std::memory_order_seq_cst) == seen) {
    timespec timeout{static_cast<time_t>(slice.count() / 1'000'000),
                     static_cast<long>(slice.count() % 1'000'000) * 1000};
    (void)futex(&w.bump, FUTEX_WAIT, seen, &timeout);
  }
  w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
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

}  // namespace weightcast::comm::gloo_backend

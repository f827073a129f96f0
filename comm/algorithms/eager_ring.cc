#include "comm/algorithms/eager_ring.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/algorithms/chain.h"
#include "comm/errors.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "comm/transport/ring_wire.h"
#include "comm/transport/single_copy.h"

namespace weightcast::comm::gloo_backend {
namespace {

constexpr std::array<char, 8> kHelloMagic = {'w', 'c', 'r', 'i', 'n', 'g', '0', '1'};
constexpr std::array<char, 8> kHeaderMagic = {'w', 'c', 'b', 'c', 'a', 's', 't', '1'};
constexpr std::size_t kHelloBytes = 12;  // magic, u32 rank
constexpr std::size_t kHeaderBytes = RingHeader::kBytes;
// A middle rank forwards what it has after at most this many bytes, so its successor's link
// starts early; the last rank reads as much as the socket holds.
constexpr std::size_t kForwardSlice = 256u << 10;
// Socket buffers of a fixed size (the kernel caps them at net.core.{w,r}mem_max), so a broadcast of
// a few MiB is handed to the kernel in one call instead of waiting for the buffers to auto-tune.
constexpr int kSocketBuffer = 4 << 20;

using Header = RingHeader;

// One broadcast on the ring, as seen from one rank: pull from the predecessor into the header and
// then the payload, push everything pulled so far to the successor, wait on both when neither
// moves. The root starts with the whole stream "pulled".
class RingBroadcast {
 public:
  RingBroadcast(int rank, int size, int pred_fd, int succ_fd, int wake_fd, std::uint8_t* data,
                const Header& header, Deadline deadline)
      : data_(data), expected_(header), deadline_(deadline), wake_fd_(wake_fd) {
    const int pos = (rank - static_cast<int>(header.root) + size) % size;
    pred_ = pos > 0 ? (rank - 1 + size) % size : -1;
    succ_ = pos < size - 1 ? (rank + 1) % size : -1;
    pred_fd_ = pred_ >= 0 ? pred_fd : -1;
    succ_fd_ = succ_ >= 0 ? succ_fd : -1;
    total_ = kHeaderBytes + header.bytes;
    if (pred_ < 0) {
      header.encode(header_.data(), kHeaderMagic);
      pulled_ = total_;
    }
  }

  void run() {
    // Sends are eager: without this check a root whose successor has left would hand its bytes to
    // a closed connection and return as if they had arrived.
    if (succ_ >= 0 && net::peer_hung_up(succ_fd_))
      fail_link(succ_, "the connection was closed", true);
    while (pulling() || pushing_left()) {
      bool moved = false;
      if (pulling()) moved = pull();
      if (can_push()) moved = push() || moved;
      if (!moved) wait();
    }
  }

 private:
  bool pulling() const { return pred_ >= 0 && pulled_ < total_; }
  bool pushing_left() const { return succ_ >= 0 && pushed_ < total_; }
  // Forwards only once the header is in and checked.
  bool can_push() const { return succ_ >= 0 && pulled_ >= kHeaderBytes && pushed_ < pulled_; }

  // Reads what the predecessor has sent (the header alone first, checked before any payload byte
  // lands in the caller's buffer). False when nothing was there.
  bool pull() {
    ssize_t n;
    if (pulled_ < kHeaderBytes) {
      n = ::recv(pred_fd_, header_.data() + pulled_, kHeaderBytes - pulled_, MSG_DONTWAIT);
    } else {
      std::size_t len = total_ - pulled_;
      if (succ_ >= 0) len = std::min(len, kForwardSlice);
      n = ::recv(pred_fd_, data_ + (pulled_ - kHeaderBytes), len, MSG_DONTWAIT);
    }
    if (n == 0) fail_link(pred_, "the connection was closed", true);
    if (n < 0) return would_block(pred_);
    pulled_ += static_cast<std::size_t>(n);
    if (pulled_ == kHeaderBytes) check_header();
    return true;
  }

  // Writes everything pulled and not yet pushed, header and payload in one call.
  bool push() {
    std::array<iovec, 2> iov{};
    int count = 0;
    if (pushed_ < kHeaderBytes) {
      iov[count++] = {header_.data() + pushed_, kHeaderBytes - pushed_};
    }
    if (pulled_ > kHeaderBytes) {
      const std::size_t from = std::max(pushed_, kHeaderBytes) - kHeaderBytes;
      iov[count++] = {data_ + from, pulled_ - kHeaderBytes - from};
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = static_cast<std::size_t>(count);
    const ssize_t n = ::sendmsg(succ_fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) return would_block(succ_);
    pushed_ += static_cast<std::size_t>(n);
    return true;
  }

  bool would_block(int peer) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return false;
    fail_link(peer, std::strerror(err), err == EPIPE || err == ECONNRESET || err == ENOTCONN);
  }

  void check_header() {
    Header got;
    if (!got.decode(header_.data(), kHeaderMagic)) {
      fail_link(pred_, "the stream does not start with a broadcast header", false);
    }
    if (!(got == expected_)) {
      fail_link(pred_, expected_.refuse(pred_, got), false);
    }
  }

  void wait() {
    std::array<pollfd, 3> fds{};
    int n = 0;
    fds[n++] = {wake_fd_, POLLIN, 0};
    if (pulling()) fds[n++] = {pred_fd_, POLLIN, 0};
    if (can_push()) fds[n++] = {succ_fd_, POLLOUT, 0};
    const int err = wait_ring({fds.data(), static_cast<std::size_t>(n)}, deadline_);
    if (err == ETIMEDOUT) {
      const int peer = pulling() ? pred_ : succ_;
      throw LinkFailure{peer, doing(peer), "timed out", false, true};
    }
    if (err != 0) fail_link(pred_ >= 0 ? pred_ : succ_, std::strerror(err), false);
  }

  std::string doing(int peer) const {
    if (peer == pred_) {
      return detail::concat("receiving ", pulled_ > kHeaderBytes ? pulled_ - kHeaderBytes : 0, "/",
                            expected_.bytes, " bytes from rank ", pred_, " (eager ring)");
    }
    return detail::concat("sending ", pushed_ > kHeaderBytes ? pushed_ - kHeaderBytes : 0, "/",
                          expected_.bytes, " bytes to rank ", succ_, " (eager ring)");
  }

  [[noreturn]] void fail_link(int peer, const std::string& what, bool gone) {
    throw LinkFailure{peer, doing(peer), what, gone, false};
  }

  std::uint8_t* data_;
  Header expected_;
  Deadline deadline_;
  int wake_fd_;
  int pred_ = -1, succ_ = -1;
  int pred_fd_ = -1, succ_fd_ = -1;
  std::array<std::uint8_t, kHeaderBytes> header_{};
  std::size_t total_ = 0;
  std::size_t pulled_ = 0;
  std::size_t pushed_ = 0;
};

std::string numeric_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  std::array<char, NI_MAXHOST> host{};
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host.data(), host.size(), nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    throw ConfigError(
        detail::concat("eager ring: cannot read the listener's address: ", std::strerror(errno)));
  }
  return host.data();
}

std::string address_key(int rank) {
  return "chain/eager/" + std::to_string(rank);
}

// Connects to the successor's published address, retrying until the deadline, and says hello.
net::Fd dial(GlooStoreAdapter& store, int rank, int succ, Deadline deadline) {
  const std::vector<char> value = store.get(address_key(succ));
  const std::string text(value.begin(), value.end());
  const auto space = text.find(' ');
  WC_ENFORCE(space != std::string::npos, "eager ring: malformed address '", text, "' of rank ",
             succ);
  const auto port = static_cast<std::uint16_t>(std::stoul(text.substr(0, space)));
  const std::string host = text.substr(space + 1);
  std::string error;
  bool timed_out = false;
  while (true) {
    net::Fd fd = net::connect_once(host, port, deadline, &error, &timed_out);
    if (fd) {
      std::array<std::uint8_t, kHelloBytes> hello{};
      std::memcpy(hello.data(), kHelloMagic.data(), kHelloMagic.size());
      put_le(hello.data() + 8, static_cast<std::uint32_t>(rank), 4);
      const auto sent = net::send_all(
          fd.get(), {reinterpret_cast<const char*>(hello.data()), hello.size()}, deadline);
      if (sent.ok()) return fd;
      error = sent.describe();
    }
    if (expired(deadline)) {
      throw TimeoutError(detail::concat("eager ring: rank ", rank, " could not connect to rank ",
                                        succ, " at ", net::endpoint(host, port), ": ", error));
    }
    std::this_thread::sleep_for(Millis(10));
  }
}

// Accepts connections until the predecessor's hello arrives; anything else is dropped.
net::Fd accept_pred(int listener, int rank, int pred, Deadline deadline) {
  while (true) {
    const auto ready = net::wait_readable(listener, deadline);
    if (!ready.ok()) {
      throw TimeoutError(detail::concat("eager ring: rank ", rank, " was not reached by rank ",
                                        pred, ": ", ready.describe()));
    }
    int err = 0;
    net::Fd fd = net::accept_one(listener, &err);
    if (!fd) continue;
    std::array<std::uint8_t, kHelloBytes> hello{};
    const auto got =
        net::recv_exact(fd.get(), reinterpret_cast<char*>(hello.data()), hello.size(), deadline);
    if (got.ok() && std::memcmp(hello.data(), kHelloMagic.data(), kHelloMagic.size()) == 0 &&
        get_le(hello.data() + 8, 4) == static_cast<std::uint64_t>(pred)) {
      return fd;
    }
  }
}

}  // namespace

std::unique_ptr<EagerRing> EagerRing::connect(GlooStoreAdapter& store, int rank, int size,
                                              const std::string& bind_address,
                                              const SingleCopyOptions& copy, Deadline deadline) {
  std::uint16_t port = 0;
  std::string error;
  net::Fd listener = net::listen_on(bind_address, 0, &port, &error);
  if (!listener) {
    throw ConfigError("eager ring: cannot listen on '" + bind_address + "': " + error);
  }
  const std::string value = std::to_string(port) + " " + numeric_host(listener.get());
  store.set(address_key(rank), std::vector<char>(value.begin(), value.end()));
  net::Fd to_succ = dial(store, rank, (rank + 1) % size, deadline);
  net::Fd from_pred = accept_pred(listener.get(), rank, (rank - 1 + size) % size, deadline);
  // Every member probes before the agreement; a member's token stays alive until the agreement's
  // second lap, which no member finishes before every member has probed.
  auto memory = PeerMemory::probe(store, rank, size, copy.enabled);
  const RingLinks links{rank, size, from_pred.get(), to_succ.get(), -1};
  if (!ring_agree(links, memory->usable(), deadline)) memory.reset();
  auto ring = std::make_unique<EagerRing>(rank, size, std::move(to_succ), std::move(from_pred),
                                          std::move(memory));
  ring->single_copy_min_ = copy.min_bytes;
  return ring;
}

EagerRing::EagerRing(int rank, int size, net::Fd to_succ, net::Fd from_pred,
                     std::unique_ptr<PeerMemory> memory)
    : rank_(rank),
      size_(size),
      to_succ_(std::move(to_succ)),
      from_pred_(std::move(from_pred)),
      memory_(std::move(memory)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!wake_) throw Error(detail::concat("eager ring: eventfd: ", std::strerror(errno)));
  for (int fd : {to_succ_.get(), from_pred_.get()}) {
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBuffer, sizeof(kSocketBuffer));
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBuffer, sizeof(kSocketBuffer));
  }
}

EagerRing::~EagerRing() = default;

void EagerRing::broadcast(std::uint8_t* data, std::size_t bytes, int root, Deadline deadline,
                          const ReceivedFn& on_received) {
  if (copies(bytes)) {
    const RingLinks links{rank_, size_, from_pred_.get(), to_succ_.get(), wake_.get()};
    single_copy_broadcast(links, *memory_, data, bytes, root, sequence_++, deadline, on_received);
    return;
  }
  Header header;
  header.sequence = sequence_++;
  header.root = static_cast<std::uint32_t>(root);
  header.bytes = bytes;
  RingBroadcast(rank_, size_, from_pred_.get(), to_succ_.get(), wake_.get(), data, header, deadline)
      .run();
}

void EagerRing::interrupt() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_.get(), &one, sizeof(one));
}

void EagerRing::shut_down() {
  ::shutdown(to_succ_.get(), SHUT_RDWR);
  shut_down_upstream();
}

void EagerRing::shut_down_upstream() {
  ::shutdown(from_pred_.get(), SHUT_RDWR);
}

}  // namespace weightcast::comm::gloo_backend

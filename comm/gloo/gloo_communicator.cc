#include "comm/gloo/gloo_communicator.h"

#include <sys/prctl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/algorithms/chain.h"
#include "comm/algorithms/eager_ring.h"
#include "comm/errors.h"
#include "comm/gloo/gloo_errors.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "comm/gloo/gloo_watchdog.h"
#include "comm/gloo/group_settings.h"
#include "comm/store/prefix_store.h"
#include "comm/torch_group.h"

namespace weightcast::comm {
namespace gloo_backend {
namespace {

// The first failure of a communicator; every later call rethrows its kind.
struct Failure {
  enum class Kind { kTimeout, kPeer, kAborted } kind = Kind::kAborted;
  std::string peer;  // for kPeer: "rank 2"
  std::string message;
};

// gloo::broadcast's binomial tree as seen from `rank`: the parent it receives from (the virtual
// rank with its highest bit cleared), then the children it sends to. When several peers are gone
// at once (one died, the others aborted because of it), these are the ones worth naming.
std::vector<int> binomial_tree_peers(int rank, int size, int root) {
  const int vrank = (rank + size - root) % size;
  int top = 0;  // bits below the first child's bit
  while ((1 << top) <= vrank) ++top;
  std::vector<int> peers;
  if (vrank != 0) peers.push_back(((vrank ^ (1 << (top - 1))) + root) % size);
  for (int bit = top; (1 << bit) < size; ++bit) {
    const int child = vrank | (1 << bit);
    if (child < size) peers.push_back((child + root) % size);
  }
  return peers;
}

std::string rank_name(int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : std::string("an unidentified peer");
}

Failure classify(const std::string& op, const LinkFailure& f, Millis timeout) {
  const std::string where = f.doing.empty() ? op : op + " while " + f.doing;
  if (f.peer_gone) {
    return {Failure::Kind::kPeer, rank_name(f.peer),
            detail::concat(where, ": the connection to ", rank_name(f.peer),
                           " closed before the data was through: ", f.gloo_what)};
  }
  if (f.timed_out || is_gloo_timeout(f.gloo_what)) {
    return {Failure::Kind::kTimeout, rank_name(f.peer),
            detail::concat(where, ": timed out (timeout ", timeout.count(), " ms): ", f.gloo_what)};
  }
  return {Failure::Kind::kPeer, rank_name(f.peer),
          detail::concat(where, ": connection to ", rank_name(f.peer), " failed: ", f.gloo_what)};
}

// Gloo writes with writev(2), which raises SIGPIPE when the peer has gone; with the default
// disposition that kills the process instead of surfacing a PeerError. An application that
// installed its own handler keeps it.
void ignore_sigpipe_if_default() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

class GlooCommunicatorImpl final : public GlooCommunicator {
 public:
  GlooCommunicatorImpl(const CommOptions& opts, std::shared_ptr<::gloo::transport::Device> device,
                       std::shared_ptr<::gloo::rendezvous::Context> context,
                       std::unique_ptr<EagerRing> ring)
      : opts_(opts),
        device_(std::move(device)),
        context_(std::move(context)),
        ring_(std::move(ring)),
        window_(*context_) {
    watch_ = std::make_unique<PeerWatch>(*context_, failed_peers_, [this] { window_.nudge_all(); });
  }

  ~GlooCommunicatorImpl() override {
    watch_.reset();  // its thread nudges window_; stop it while everything else is alive
    window_.clear();
  }

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  std::string_view backend() const override { return "gloo"; }
  Millis default_timeout() const override { return opts_.timeout; }

  void broadcast(const BroadcastOptions& opts) override {
    if (opts_.torch_compatible) {
      torch_broadcast(opts);
      return;
    }
    check_args(opts);
    const Millis timeout = opts.timeout.value_or(opts_.timeout);
    ChainArgs args;
    args.data = static_cast<std::uint8_t*>(opts.buffer);
    args.bytes = opts.bytes;
    args.root = opts.root;
    args.chunk_bytes = opts_.gloo.chain.chunk_bytes;
    args.in_flight = opts_.gloo.chain.chunks_in_flight;
    args.deadline = deadline_after(timeout);
    if (opts.bytes == 0 || opts_.size == 1) return;
    if (ring_ && (opts.bytes <= opts_.gloo.eager_ring.max_bytes || ring_->copies(opts.bytes))) {
      run_collective("gloo broadcast", timeout, [&] {
        ring_->broadcast(args.data, args.bytes, args.root, args.deadline, opts.on_received);
      });
      if (!ring_->copies(opts.bytes)) report_received_whole(opts, opts_.rank);
      return;
    }
    args.slot = static_cast<std::uint64_t>(context_->nextSlot());
    run_collective("gloo broadcast", timeout,
                   [&] { chain_broadcast(*context_, window_, failed_peers_, args); });
    window_.clear();
    report_received_whole(opts, opts_.rank);
  }

  bool single_copy() const override { return ring_ && ring_->single_copy(); }
  std::string_view data_path() const override {
    if (opts_.torch_compatible) return "gloo-tree";
    return single_copy() ? "single-copy" : "chain";
  }

  void broadcast_stock(const BroadcastOptions& opts) override {
    check_args(opts);
    const Millis timeout = opts.timeout.value_or(opts_.timeout);
    if (opts.bytes == 0 || opts_.size == 1) return;
    tree_broadcast("gloo stock broadcast", opts, timeout, std::nullopt);
    report_received_whole(opts, opts_.rank);
  }

  void barrier(Millis timeout) override {
    WC_ENFORCE_GT(timeout.count(), 0, "barrier timeout (ms)");
    throw_if_failed();
    const std::uint32_t tag = next_torch_tag_++;  // ProcessGroupGloo counts barriers too
    if (opts_.size == 1) return;
    suspects_.clear();
    run_collective("gloo barrier", timeout, [&] {
      ::gloo::BarrierOptions o(context_);
      if (opts_.torch_compatible) o.setTag(tag);
      o.setTimeout(timeout);
      ::gloo::barrier(o);
    });
  }

  // ProcessGroupGloo's broadcast of one CPU tensor: gloo::broadcast with the next collective tag
  // (ProcessGroupGloo::nextTag(), from 0, one per collective). Bytes are bytes on the wire, so a
  // torch member may broadcast any dtype of the same byte count (the tree splits nothing).
  void torch_broadcast(const BroadcastOptions& opts) {
    check_args(opts);
    const Millis timeout = opts.timeout.value_or(opts_.timeout);
    const std::uint32_t tag = next_torch_tag_++;
    if (opts_.size == 1) return;
    tree_broadcast("gloo broadcast (torch-compatible)", opts, timeout, tag);
    report_received_whole(opts, opts_.rank);
  }

  void abort() override {
    fail({Failure::Kind::kAborted, "", "gloo communicator aborted by abort()"});
    if (ring_) ring_->shut_down();
  }

  bool aborted() const override { return failed_.load(); }

 private:
  // gloo::broadcast of `opts`' buffer (a binomial tree), with the collective tag `tag` if given.
  void tree_broadcast(const char* what, const BroadcastOptions& opts, Millis timeout,
                      std::optional<std::uint32_t> tag) {
    suspects_ = binomial_tree_peers(opts_.rank, opts_.size, opts.root);
    run_collective(what, timeout, [&] {
      ::gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<std::uint8_t*>(opts.buffer), opts.bytes);
      o.setRoot(opts.root);
      if (tag) o.setTag(*tag);
      o.setTimeout(timeout);
      ::gloo::broadcast(o);
    });
  }

  void check_args(const BroadcastOptions& opts) const {
    check_broadcast_options(*this, opts);
    WC_ENFORCE(opts.memory == MemoryKind::kHost,
               "gloo backend handles host memory only; got memory kind '", to_string(opts.memory),
               "'");
    throw_if_failed();
  }

  // Runs one Gloo collective with the watchdog on; any failure aborts the communicator and is
  // rethrown as the first failure's typed error.
  template <typename Fn>
  void run_collective(const std::string& op, Millis timeout, Fn&& fn) {
    struct Active {
      PeerWatch& w;
      explicit Active(PeerWatch& watch) : w(watch) { w.begin(); }
      ~Active() { w.end(); }
    } active(*watch_);
    try {
      fn();
      return;
    } catch (const EnforceError& e) {
      // A bug of ours mid-collective: the transport state is unknown, so still abort.
      fail({Failure::Kind::kAborted, "", op + ": " + e.what()});
      window_.clear();
      throw;
    } catch (const WaitInterrupted&) {
      fail({Failure::Kind::kAborted, "", op + ": interrupted"});
    } catch (const LinkFailure& f) {
      fail(classify(op, f, timeout));
    } catch (const std::exception& e) {
      // Gloo's own collectives do not say which pair failed; the watchdog may know.
      watch_->probe_now();
      fail(classify(op, LinkFailure{failed_peers_.first_of(suspects_), "", e.what()}, timeout));
    }
    // The transport is down now, so Gloo no longer touches the chunk buffers.
    window_.clear();
    throw_failure(false);
  }

  // Records the first failure, wakes the collective in flight and tears the transport down.
  // Safe from any thread, idempotent; returns once the teardown has completed.
  void fail(Failure f) {
    bool timed_out = false;
    {
      std::lock_guard lock(mu_);
      if (!failure_) failure_ = std::move(f);
      failed_.store(true);
      timed_out = failure_->kind == Failure::Kind::kTimeout;
    }
    window_.wake_all();
    if (ring_) {
      ring_->interrupt();
      // A closure travels down the ring at once, so every rank behind a dead one fails as a peer
      // failure well before its deadline. A timeout does not: the ranks behind reach their own
      // deadline or are aborted by their owner, and report a timeout too instead of the closure
      // this rank would cause (abort() closes both connections).
      if (timed_out) {
        ring_->shut_down_upstream();
      } else {
        ring_->shut_down();
      }
    }
    std::call_once(teardown_once_, [this] { teardown_transport(); });
  }

  // Fails every pair of the context the way Gloo does after a wait timed out: pending buffers
  // are woken with an error and the sockets are closed, so peers learn at once. A zero-timeout
  // wait on a fresh buffer is the public way to trigger that path.
  void teardown_transport() {
    if (opts_.size == 1) return;
    char byte = 0;
    auto probe = context_->createUnboundBuffer(&byte, 1);
    try {
      probe->waitRecv(nullptr, Millis(0));
    } catch (const std::exception&) {
      // expected: the probe "timed out" and took the pairs down with it
    }
  }

  void throw_if_failed() const {
    if (failed_.load()) throw_failure(true);
  }

  [[noreturn]] void throw_failure(bool later) const {
    Failure f;
    {
      std::lock_guard lock(mu_);
      f = *failure_;
    }
    const std::string msg = later ? "gloo communicator is aborted after: " + f.message : f.message;
    switch (f.kind) {
      case Failure::Kind::kTimeout:
        throw TimeoutError(msg);
      case Failure::Kind::kPeer:
        throw PeerError(f.peer, msg);
      case Failure::Kind::kAborted:
        break;
    }
    throw Error(msg);
  }

  CommOptions opts_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::unique_ptr<EagerRing> ring_;  // null: every broadcast takes the Gloo chain
  ChunkWindow window_;
  FailedPeers failed_peers_;
  std::unique_ptr<PeerWatch> watch_;

  mutable std::mutex mu_;
  std::optional<Failure> failure_;
  std::atomic<bool> failed_{false};
  std::once_flag teardown_once_;
  std::uint32_t next_torch_tag_ = 0;  // collectives run on one thread at a time
  std::vector<int> suspects_;         // the peers of the collective in flight, to name first
};

std::shared_ptr<::gloo::transport::Device> make_device(const std::string& address) {
  if (address.empty()) throw ConfigError("gloo: bind_address must not be empty");
  ::gloo::transport::tcp::attr attr;
  attr.hostname = address;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw ConfigError("gloo: cannot bind the TCP transport to '" + address + "': " + e.what());
  }
}

[[noreturn]] void rethrow_rendezvous(const std::string& who, const std::exception& e) {
  const std::string msg = "gloo rendezvous of " + who + " failed: " + e.what();
  if (is_gloo_timeout(e.what())) throw TimeoutError(msg);
  throw PeerError("a peer connecting during rendezvous", msg);
}

// A group with torch members: the keys ProcessGroupGloo uses (its per-device prefix inside the
// group's chain) and nothing of ours (no chunk size, no "connected" keys torch would never set).
std::unique_ptr<GlooCommunicator> connect_torch_compatible(
    const CommOptions& opts, std::shared_ptr<::gloo::transport::Device> device,
    const std::shared_ptr<::gloo::rendezvous::Context>& context, const std::string& who) {
  auto scoped = std::make_shared<PrefixStore>(torch_gloo_device_prefix(0), opts.store);
  GlooStoreAdapter store(scoped, opts.timeout, who);
  try {
    context->connectFullMesh(store, device);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_rendezvous(who, e);
  }
  return std::make_unique<GlooCommunicatorImpl>(opts, std::move(device), context, nullptr);
}

// SingleCopyOptions::allow_same_user_reads. EINVAL means the kernel has no Yama (nothing to allow:
// same-user reads are already permitted); any other refusal leaves the group to find out at its
// probe, which then keeps it on sockets.
void allow_same_user_reads() {
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL) {
    std::fprintf(stderr, "weightcast: prctl(PR_SET_PTRACER_ANY) failed: %s\n",
                 std::strerror(errno));
  }
}

}  // namespace
}  // namespace gloo_backend

std::unique_ptr<GlooCommunicator> create_gloo_communicator(const CommOptions& opts) {
  using namespace gloo_backend;
  check_comm_options(opts);
  ignore_sigpipe_if_default();
  auto device = make_device(opts.gloo.bind_address);
  auto context = std::make_shared<::gloo::rendezvous::Context>(opts.rank, opts.size);
  context->setTimeout(opts.timeout);
  const std::string who = detail::concat("rank ", opts.rank, " of ", opts.size);
  if (opts.torch_compatible) return connect_torch_compatible(opts, std::move(device), context, who);
  if (opts.gloo.single_copy.enabled && opts.gloo.single_copy.allow_same_user_reads)
    allow_same_user_reads();
  GlooStoreAdapter store(opts.store, opts.timeout, who);
  try {
    if (opts.rank == 0) publish_group_settings(store, opts);
    context->connectFullMesh(store, device);
    if (opts.rank != 0) check_group_settings(store, opts);
    std::unique_ptr<EagerRing> ring;
    if (opts.size > 1 && opts.gloo.eager_ring.max_bytes > 0) {
      ring = EagerRing::connect(store, opts.rank, opts.size, opts.gloo.bind_address,
                                opts.gloo.single_copy, deadline_after(opts.timeout));
    }
    auto comm = std::make_unique<GlooCommunicatorImpl>(opts, std::move(device), std::move(context),
                                                       std::move(ring));
    // connectFullMesh returns once this rank's side of every pair is up, possibly before a peer
    // has accepted; a rank that closed at once would break that peer's rendezvous. So nobody
    // returns until everybody is through.
    store.set("connected/" + std::to_string(opts.rank), {'1'});
    std::vector<std::string> keys;
    for (int r = 0; r < opts.size; ++r) keys.push_back("connected/" + std::to_string(r));
    store.wait(keys);
    return comm;
  } catch (const Error&) {
    throw;  // our store's typed errors, already phrased
  } catch (const std::exception& e) {
    rethrow_rendezvous(who, e);
  }
}

}  // namespace weightcast::comm

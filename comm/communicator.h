// Communicator: a fixed group of ranks that can broadcast bytes, with every wait bounded.
//
// Lifetime: created by create_communicator() after a rendezvous through a Store; owned by one
// caller. A communicator that timed out or saw a peer fail is aborted: every later call throws
// the same kind of error, and the caller builds a new one (a new rendezvous) to recover.
// Threading: collectives are called from one thread at a time; abort() may be called from any
// thread (a watchdog) and makes a blocked collective return with an Error promptly.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/deadline.h"
#include "comm/store.h"

namespace weightcast::comm {

enum class MemoryKind { kHost, kCuda };

std::string_view to_string(MemoryKind kind);

// See BroadcastOptions::on_received.
using ReceivedFn = std::function<void(std::size_t offset, std::size_t bytes)>;

// One broadcast: `bytes` bytes at `buffer` on `root` are copied into `buffer` on every rank.
struct BroadcastOptions {
  void* buffer = nullptr;
  std::size_t bytes = 0;
  int root = 0;
  MemoryKind memory = MemoryKind::kHost;
  std::optional<Millis> timeout;  // unset: the communicator's default
  // Receivers only, optional: called on the calling thread as the buffer fills, with consecutive
  // ranges that together cover [0, bytes) once, in order, each once its bytes are final. Gloo's
  // same-host single copy reports each piece as it lands (still in the cache, so a caller can
  // digest it in the same pass); every other path reports the whole buffer once, at the end. An
  // exception it throws ends the broadcast on this rank with that exception.
  ReceivedFn on_received;
};

// For paths that fill the buffer in one go: reports it whole to a receiver's on_received.
inline void report_received_whole(const BroadcastOptions& opts, int rank) {
  if (opts.on_received && rank != opts.root && opts.bytes > 0) opts.on_received(0, opts.bytes);
}

// What every backend needs to form a group, plus backend tuning knobs with safe defaults.
struct CommOptions {
  std::shared_ptr<Store> store;  // rendezvous; scope it with a PrefixStore per group
  int rank = -1;
  int size = 0;
  Millis timeout{30000};  // default for rendezvous and every collective

  // Gloo: the address the TCP transport binds and advertises to peers.
  std::string bind_address = "127.0.0.1";
  // Gloo chain broadcast: bytes per chunk and chunks kept in flight on each link.
  std::size_t chunk_bytes = 4u << 20;
  int chunks_in_flight = 4;
  // Gloo: broadcasts of at most this many bytes skip Gloo and go down the chain's eager ring (one
  // TCP connection per rank to the next, progressed in the calling thread); 0 turns it off. Every
  // member must use the same value, like chunk_bytes.
  std::size_t eager_max_bytes = 16u << 20;
  // Gloo, eager ring on: when every member runs on one host (same boot, network and PID
  // namespace, user), receivers copy broadcasts of at least single_copy_min_bytes, of any size,
  // straight out of a ring neighbour's memory with process_vm_readv instead of through sockets or
  // Gloo (comm/transport/single_copy.h). The group agrees: one member with false, or one the kernel
  // will not let the others read, keeps the whole group on sockets and Gloo. Smaller broadcasts
  // stay on the ring's sockets, which have the lower latency below it. Every member must use the
  // same single_copy_min_bytes. The default is the measured crossover (docs/performance.md,
  // "Same-host single copy as a pipelined chain"): at 64 KiB the two paths are even, from 128 KiB
  // single copy won every run by 1.8x or more.
  bool single_copy = true;
  std::size_t single_copy_min_bytes = 128u << 10;
  // Gloo, single copy on: declare every process of this user a permitted reader of this one's
  // memory (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)) before the group probes, so single copy
  // works under Yama ptrace_scope 1 without lowering it system-wide. Every member of the group
  // must set it (each reads the others' tokens; receivers read the root's buffers). What it
  // exposes: docs/security.md, "Same-host single copy".
  bool allow_same_user_reads = false;

  // NCCL: CUDA device ordinal to use (-1: the calling thread's current device).
  int cuda_device = -1;

  // The group has torch.distributed members (comm/torch_group.h): rendezvous under the keys
  // ProcessGroupGloo / ProcessGroupNCCL use (opts.store must already carry torch's prefix chain)
  // and run the collectives they run, one broadcast() per dist.broadcast() of a torch member.
  // Gloo then uses gloo::broadcast (a binomial tree) instead of the pipelined chain, and
  // chunk_bytes / chunks_in_flight are unused.
  bool torch_compatible = false;
};

// The options of member `rank` of a group of `size` over `store`, with `timeout` as the default
// deadline; every backend knob keeps its default.
CommOptions member_options(std::shared_ptr<Store> store, int rank, int size, Millis timeout);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;
  virtual Millis default_timeout() const = 0;
  // How large broadcasts travel in this group, as the group agreed: "single-copy" (same-host
  // process_vm_readv), "chain" (the pipelined chain over sockets), "gloo-tree" (torch-compatible
  // gloo::broadcast), "nccl". For /metrics, the trainer's step line and the bench.
  virtual std::string_view data_path() const = 0;

  // Throws EnforceError on misuse (null buffer with bytes > 0, root out of range, a memory kind
  // the backend cannot handle), TimeoutError / PeerError on failure (the communicator is then
  // aborted).
  virtual void broadcast(const BroadcastOptions& opts) = 0;

  virtual void barrier(Millis timeout) = 0;

  // Tears the group down: pending and later collectives fail. Idempotent, thread-safe.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;
};

// Backends compiled into this build: "gloo" always, "nccl" when built with NCCL.
std::vector<std::string> available_backends();

// Rendezvouses through opts.store and returns a ready communicator for `backend` ("gloo" or
// "nccl"). Throws ConfigError for an unknown or unbuilt backend, TimeoutError when the group
// does not form within opts.timeout.
std::unique_ptr<Communicator> create_communicator(std::string_view backend,
                                                  const CommOptions& opts);

// Shared argument checks every backend runs first (see WC_ENFORCE).
void check_broadcast_options(const Communicator& comm, const BroadcastOptions& opts);
void check_comm_options(const CommOptions& opts);

}  // namespace weightcast::comm

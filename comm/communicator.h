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
#include "comm/gloo/gloo_options.h"
#include "comm/nccl/nccl_options.h"
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

// What every backend needs to form a group, plus each backend's options with safe defaults.
struct CommOptions {
  std::shared_ptr<Store> store;  // rendezvous; scope it with a PrefixStore per group
  int rank = -1;
  int size = 0;
  Millis timeout{30000};  // default for rendezvous and every collective

  GlooOptions gloo;  // the Gloo backend's algorithms (comm/gloo/gloo_options.h)
  NcclOptions nccl;  // the NCCL backend (comm/nccl/nccl_options.h)

  // The group has torch.distributed members (comm/torch_group.h): rendezvous under the keys
  // ProcessGroupGloo / ProcessGroupNCCL use (opts.store must already carry torch's prefix chain)
  // and run the collectives they run, one broadcast() per dist.broadcast() of a torch member.
  // Gloo then uses gloo::broadcast (a binomial tree) instead of the pipelined chain, and
  // gloo.chain is unused.
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

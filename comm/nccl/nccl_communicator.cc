#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/errors.h"
#include "comm/nccl/cuda_device.h"
#include "comm/nccl/nccl_compat.h"
#include "comm/nccl/nccl_unique_id.h"
#include "comm/torch_group.h"

namespace weightcast::comm {
namespace {

using nccl_detail::describe_cuda_error;
using nccl_detail::ScopedDevice;

// A few yields, then short sleeps: a weight bucket takes milliseconds on the wire, so polling at
// sub-millisecond granularity costs nothing measurable and leaves the core to the packer.
class Backoff {
 public:
  void pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(500));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{20};
};

// Why the communicator stopped working; later calls throw the same kind of error.
enum class Failure { kNone, kTimeout, kPeer, kConfig, kLocal };

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const CommOptions& opts, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Creates the NCCL communicator from `id` and waits, until `deadline`, for the group to form.
  void connect(const NcclUniqueIdBytes& id, Deadline deadline);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  std::string_view data_path() const override { return "nccl"; }
  Millis default_timeout() const override { return timeout_; }

  void broadcast(const BroadcastOptions& opts) override;
  void barrier(Millis timeout) override;
  void abort() override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }

 private:
  // Enqueues one collective with `launch(comm, stream)` and waits for it to finish on the stream.
  template <typename Launch>
  void run_collective(const std::string& what, Deadline deadline, Launch&& launch);

  // Waits until the communicator's state leaves ncclInProgress and, when `stream_done` is set,
  // the stream has drained. Aborts and throws on an error or at the deadline.
  void wait_until_idle(const std::string& what, Deadline deadline, bool stream_done);

  // The caller holds mu_. Aborts the NCCL communicator, records why, and throws.
  [[noreturn]] void fail_locked(Failure kind, const std::string& message);
  void throw_if_failed_locked() const;
  [[noreturn]] void throw_failure(Failure kind, const std::string& message) const;
  void abort_comm_locked();
  void destroy_healthy_locked();
  std::string peer_name() const;

  const int rank_;
  const int size_;
  const int device_;
  const Millis timeout_;

  cudaStream_t stream_ = nullptr;  // non-blocking: never serializes with the legacy stream
  int* scratch_ = nullptr;         // one device int for barrier()

  mutable std::mutex mu_;  // guards every NCCL call on comm_ and the fields below
  // NCCL writes the handle here from its init thread as well, so it lives as long as this object.
  ncclComm_t init_slot_ = nullptr;
  ncclComm_t comm_ = nullptr;  // null once aborted or destroyed
  Failure failure_ = Failure::kNone;
  std::string failure_message_;
  std::atomic<bool> aborted_{false};
};

NcclCommunicator::NcclCommunicator(const CommOptions& opts, int device)
    : rank_(opts.rank), size_(opts.size), device_(device), timeout_(opts.timeout) {
  ScopedDevice scoped(device_);
  if (const auto error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      error != cudaSuccess) {
    stream_ = nullptr;
    throw ConfigError("nccl backend: cannot create a CUDA stream (" + describe_cuda_error(error) +
                      ")");
  }
  void* scratch = nullptr;
  if (const auto error = cudaMalloc(&scratch, sizeof(int)); error != cudaSuccess) {
    cudaStreamDestroy(stream_);
    throw ConfigError("nccl backend: cannot allocate device memory (" + describe_cuda_error(error) +
                      ")");
  }
  scratch_ = static_cast<int*>(scratch);
  // On our stream, so the first barrier is ordered after it (the stream does not wait for the
  // legacy default stream).
  (void)cudaMemsetAsync(scratch_, 0, sizeof(int), stream_);
}

NcclCommunicator::~NcclCommunicator() {
  try {
    ScopedDevice scoped(device_);
    {
      std::lock_guard lock(mu_);
      if (comm_ != nullptr) {
        if (failure_ == Failure::kNone) {
          destroy_healthy_locked();
        } else {
          abort_comm_locked();
        }
      }
    }
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  } catch (...) {
    // A destructor never throws; the device is gone, so there is nothing left to free.
  }
}

void NcclCommunicator::destroy_healthy_locked() {
  // Finalize flushes outstanding work without blocking us; a peer that never quiesces cannot
  // hold the destructor longer than the default timeout, after which we abort.
  const Deadline deadline = deadline_after(timeout_);
  ncclResult_t state = ncclCommFinalize(comm_);
  Backoff backoff;
  while (state == ncclInProgress && !expired(deadline)) {
    backoff.pause();
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
  }
  if (state == ncclSuccess) {
    (void)ncclCommDestroy(comm_);  // local only after a finished finalize; may complete async
    comm_ = nullptr;
  } else {
    abort_comm_locked();
  }
}

void NcclCommunicator::abort_comm_locked() {
  if (comm_ == nullptr) return;
  // In non-blocking mode NCCL may finish the teardown on its own thread; the handle is dead
  // either way, so it is dropped right here.
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_.store(true, std::memory_order_release);
}

std::string NcclCommunicator::peer_name() const {
  return detail::concat("nccl group of ", size_, " rank(s), seen from rank ", rank_,
                        " on CUDA device ", device_);
}

void NcclCommunicator::throw_failure(Failure kind, const std::string& message) const {
  switch (kind) {
    case Failure::kTimeout:
      throw TimeoutError(message);
    case Failure::kPeer:
      throw PeerError(peer_name(), message);
    case Failure::kConfig:
      throw ConfigError(message);
    case Failure::kLocal:
    case Failure::kNone:
      break;
  }
  throw Error(message);
}

void NcclCommunicator::fail_locked(Failure kind, const std::string& message) {
  abort_comm_locked();
  aborted_.store(true, std::memory_order_release);
  if (failure_ == Failure::kNone) {
    failure_ = kind;
    failure_message_ = message;
  }
  throw_failure(kind, message + "; communicator aborted");
}

void NcclCommunicator::throw_if_failed_locked() const {
  if (failure_ == Failure::kNone) return;
  throw_failure(failure_, "nccl communicator is aborted: " + failure_message_);
}

void NcclCommunicator::connect(const NcclUniqueIdBytes& id_bytes, Deadline deadline) {
  ScopedDevice scoped(device_);
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclConfig_t config = nccl_compat::nonblocking_config();
  {
    std::lock_guard lock(mu_);
    const ncclResult_t result = ncclCommInitRankConfig(&init_slot_, size_, id, rank_, &config);
    comm_ = __atomic_load_n(&init_slot_, __ATOMIC_ACQUIRE);
    if (result != ncclSuccess && result != ncclInProgress) {
      // Invalid argument/usage at init is an environment NCCL cannot honour (for instance two
      // ranks of the group on one GPU); everything else is blamed on the group.
      const bool config_error = result == ncclInvalidArgument || result == ncclInvalidUsage;
      fail_locked(config_error ? Failure::kConfig : Failure::kPeer,
                  "ncclCommInitRankConfig failed: " + nccl_compat::describe(result, nullptr));
    }
    if (comm_ == nullptr) fail_locked(Failure::kLocal, "ncclCommInitRankConfig returned no comm");
  }
  wait_until_idle("forming the nccl group", deadline, /*stream_done=*/false);
}

void NcclCommunicator::wait_until_idle(const std::string& what, Deadline deadline,
                                       bool stream_done) {
  Backoff backoff;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      throw_if_failed_locked();  // abort() from another thread lands here
      if (comm_ == nullptr) throw_failure(Failure::kLocal, "nccl communicator is aborted");
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) {
        const bool config_error = state == ncclInvalidArgument || state == ncclInvalidUsage;
        fail_locked(config_error ? Failure::kConfig : Failure::kPeer,
                    what + " failed: " + nccl_compat::describe(state, nullptr));
      }
      if (state == ncclSuccess) {
        if (!stream_done) return;
        const cudaError_t query = cudaStreamQuery(stream_);
        if (query == cudaSuccess) return;
        if (query != cudaErrorNotReady) {
          (void)cudaGetLastError();
          fail_locked(Failure::kLocal,
                      what + " failed on the CUDA stream: " + describe_cuda_error(query));
        }
      }
      if (expired(deadline)) {
        fail_locked(Failure::kTimeout, detail::concat(what, " timed out (rank ", rank_, " of ",
                                                      size_, ", CUDA device ", device_, ")"));
      }
    }
    backoff.pause();
  }
}

template <typename Launch>
void NcclCommunicator::run_collective(const std::string& what, Deadline deadline, Launch&& launch) {
  ScopedDevice scoped(device_);
  {
    std::lock_guard lock(mu_);
    throw_if_failed_locked();
    if (comm_ == nullptr) throw_failure(Failure::kLocal, "nccl communicator is aborted");
    const ncclResult_t result = launch(comm_, stream_);
    // ncclInProgress: NCCL is still enqueueing; wait_until_idle waits for that first.
    if (result != ncclSuccess && result != ncclInProgress) {
      fail_locked(Failure::kPeer, what + " failed: " + nccl_compat::describe(result, nullptr));
    }
  }
  wait_until_idle(what, deadline, /*stream_done=*/true);
}

void NcclCommunicator::broadcast(const BroadcastOptions& opts) {
  check_broadcast_options(*this, opts);
  nccl_detail::check_device_buffer(opts, device_);
  const Millis timeout = opts.timeout.value_or(timeout_);
  const Deadline deadline = deadline_after(timeout);
  if (opts.bytes == 0) {
    std::lock_guard lock(mu_);
    throw_if_failed_locked();
    return;
  }
  const std::string what = detail::concat("nccl broadcast of ", opts.bytes, " bytes from root ",
                                          opts.root, " within ", timeout.count(), " ms");
  run_collective(what, deadline, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(opts.buffer, opts.buffer, opts.bytes, ncclUint8, opts.root, comm, stream);
  });
  report_received_whole(opts, rank_);  // device memory: offsets only, for the caller's bookkeeping
}

void NcclCommunicator::barrier(Millis timeout) {
  WC_ENFORCE_GT(timeout.count(), 0, "barrier timeout (ms)");
  // A max-reduction keeps the scratch value fixed, so repeated barriers never overflow it.
  run_collective(detail::concat("nccl barrier within ", timeout.count(), " ms"),
                 deadline_after(timeout), [&](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclMax, comm, stream);
                 });
}

void NcclCommunicator::abort() {
  std::lock_guard lock(mu_);
  if (failure_ == Failure::kNone) {
    failure_ = Failure::kLocal;
    failure_message_ = "abort() was called";
  }
  abort_comm_locked();
  aborted_.store(true, std::memory_order_release);
}

}  // namespace

std::unique_ptr<Communicator> create_nccl_communicator(const CommOptions& opts) {
  check_comm_options(opts);
  nccl_compat::check_runtime_version();
  const Deadline deadline = deadline_after(opts.timeout);
  // The device is checked before the rendezvous, so a rank without a GPU fails fast with
  // ConfigError instead of leaving its peers to time out on a half-formed group.
  const int device = nccl_detail::resolve_cuda_device(opts.nccl.cuda_device);
  ScopedDevice scoped(device);
  auto comm = std::make_unique<NcclCommunicator>(opts, device);
  // A group with torch members exchanges the id where ProcessGroupNCCL does: the key of the
  // group's first communicator, "0", under the group's torch prefix chain.
  const std::string key =
      opts.torch_compatible ? torch_nccl_unique_id_key(0) : std::string(kNcclUniqueIdKey);
  NcclUniqueIdBytes id;
  if (opts.rank == 0) {
    id = create_nccl_unique_id();
    publish_unique_id(*opts.store, id, remaining(deadline), key);
  } else {
    try {
      id = fetch_unique_id(*opts.store, remaining(deadline), key);
    } catch (const TimeoutError& e) {
      throw TimeoutError(detail::concat("nccl rank ", opts.rank, " of ", opts.size,
                                        " got no unique id from rank 0 within ",
                                        opts.timeout.count(), " ms (", e.what(), ")"));
    }
  }
  comm->connect(id, deadline);
  return comm;
}

}  // namespace weightcast::comm

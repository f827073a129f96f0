#include "comm/communicator.h"

#include "comm/errors.h"
#include "comm/gloo/gloo_communicator.h"
#include "weightcast/config.h"
#if WEIGHTCAST_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace weightcast::comm {

std::string_view to_string(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "cuda";
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out{"gloo"};
#if WEIGHTCAST_HAVE_NCCL
  out.emplace_back("nccl");
#endif
  return out;
}

CommOptions member_options(std::shared_ptr<Store> store, int rank, int size, Millis timeout) {
  CommOptions opts;
  opts.store = std::move(store);
  opts.rank = rank;
  opts.size = size;
  opts.timeout = timeout;
  return opts;
}

void check_comm_options(const CommOptions& opts) {
  WC_ENFORCE(opts.store != nullptr, "CommOptions.store must be set");
  WC_ENFORCE_GT(opts.size, 0, "group size");
  WC_ENFORCE_GE(opts.rank, 0, "rank");
  WC_ENFORCE_LT(opts.rank, opts.size, "rank must be below the group size");
  WC_ENFORCE_GT(opts.timeout.count(), 0, "timeout (ms)");
  WC_ENFORCE_GT(opts.gloo.chain.chunk_bytes, std::size_t{0}, "chunk_bytes");
  WC_ENFORCE_GT(opts.gloo.chain.chunks_in_flight, 0, "chunks_in_flight");
}

void check_broadcast_options(const Communicator& comm, const BroadcastOptions& opts) {
  WC_ENFORCE_GE(opts.root, 0, "broadcast root");
  WC_ENFORCE_LT(opts.root, comm.size(), "broadcast root must be below the group size");
  WC_ENFORCE(opts.buffer != nullptr || opts.bytes == 0, "null buffer for ", opts.bytes, " bytes");
  if (opts.timeout) WC_ENFORCE_GT(opts.timeout->count(), 0, "broadcast timeout (ms)");
}

std::unique_ptr<Communicator> create_communicator(std::string_view backend,
                                                  const CommOptions& opts) {
  check_comm_options(opts);
  if (backend == "gloo") return create_gloo_communicator(opts);
  if (backend == "nccl") {
#if WEIGHTCAST_HAVE_NCCL
    return create_nccl_communicator(opts);
#else
    throw ConfigError(
        "backend 'nccl' is not built into this weightcast (configure with "
        "-DWEIGHTCAST_WITH_NCCL=ON on a machine with CUDA and NCCL)");
#endif
  }
  throw ConfigError("unknown backend '" + std::string(backend) + "' (expected gloo or nccl)");
}

}  // namespace weightcast::comm

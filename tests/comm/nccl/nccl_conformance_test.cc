// The backend conformance suite, instantiated for NCCL: CUDA device buffers, one GPU per rank.
// Cases with more ranks than this machine has GPUs skip with the reason.
#include <cuda_runtime_api.h>

#include "comm/communicator.h"
#include "comm/device_memory.h"
#include "tests/comm/conformance/conformance.h"
#include "tests/comm/nccl/nccl_test_util.h"

namespace {

weightcast::testing::BackendSpec nccl_spec() {
  namespace wc = weightcast::comm;
  weightcast::testing::BackendSpec s;
  s.name = "nccl";
  s.memory = wc::MemoryKind::kCuda;
  s.skip_reason = [](int world) { return wc::nccl_testing::cuda_skip_reason(world); };
  s.configure_rank = [](int rank, wc::CommOptions& o) {
    o.nccl.cuda_device = rank;
    // The suite allocates after this on the same thread: put the rank's buffers on its GPU.
    (void)cudaSetDevice(rank);
  };
  s.create = [](const wc::CommOptions& o) { return wc::create_communicator("nccl", o); };
  s.alloc = [](std::size_t bytes) { return wc::cuda_alloc(bytes); };
  s.free = [](void* buffer) { wc::cuda_free(buffer); };
  s.copy_to_buffer = [](void* buffer, const void* host, std::size_t bytes) {
    wc::cuda_copy_to_device(buffer, host, bytes);
  };
  s.copy_from_buffer = [](void* host, const void* buffer, std::size_t bytes) {
    wc::cuda_copy_to_host(host, buffer, bytes);
  };
  return s;
}

}  // namespace

WC_INSTANTIATE_CONFORMANCE(Nccl, nccl_spec());

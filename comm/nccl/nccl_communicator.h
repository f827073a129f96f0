// NCCL backend: CUDA device-memory broadcast with ncclBroadcast on the communicator's own stream.
//
// Rank 0 creates the unique id and publishes it through the Store; others wait for it with the
// rendezvous timeout. The NCCL communicator is created non-blocking; every wait polls the stream
// and ncclCommGetAsyncError against a deadline and calls ncclCommAbort on timeout or error before
// throwing TimeoutError / PeerError. Host buffers are refused (EnforceError).
// Lifetime/threading: as Communicator. This header does not include nccl.h or CUDA headers.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weightcast::comm {

// Throws ConfigError when no CUDA device is usable (with the CUDA error text).
std::unique_ptr<Communicator> create_nccl_communicator(const CommOptions& opts);

}  // namespace weightcast::comm

// NCCL backend: CUDA device-memory broadcast with ncclBroadcast on the communicator's own stream.
//
// Rank 0 creates the unique id and publishes it through the Store under a fixed key (see
// comm/nccl/nccl_unique_id.h: scope each group with its own PrefixStore); others wait for it with
// the rendezvous timeout. The NCCL communicator is created non-blocking; every wait polls the
// stream and ncclCommGetAsyncError against a deadline and calls ncclCommAbort on timeout or error
// before throwing TimeoutError / PeerError. Host buffers are refused (EnforceError), and so is a
// pointer CUDA does not report as device or managed memory of the communicator's device.
// broadcast() returns when the bytes are in place on this rank; the caller must have finished
// writing the root's buffer (synchronized its own streams) before calling it. After a failure the
// buffer's contents are undefined.
// Errors after the group formed: TimeoutError (deadline), PeerError (NCCL reported an error),
// ConfigError (NCCL refused the setup, e.g. two ranks on one GPU), Error (a local CUDA failure,
// or abort() was called); each aborts the communicator, and later calls throw the same kind.
// Lifetime/threading: as Communicator; each call makes the communicator's device current for its
// duration and restores the caller's. Destruction finalizes a healthy communicator (bounded by the
// default timeout, then aborts) and aborts a failed one. This header does not include nccl.h or
// CUDA headers.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weightcast::comm {

// Throws ConfigError when no CUDA device is usable (with the CUDA error text) or opts.cuda_device
// does not exist, before touching the store; TimeoutError when the group does not form within
// opts.timeout.
std::unique_ptr<Communicator> create_nccl_communicator(const CommOptions& opts);

}  // namespace weightcast::comm

// The colocated path's receive (docs/colocated.md): one bucket copied out of the trainer's shared
// segment into staging memory.
//
// copy_segment() connects to the abstract unix socket the request names, takes the segment's
// read-only descriptor from it (comm/colocate/handle_exchange.h: same uid, the session's token,
// bounded by `timeout`), maps it read-only after checking it is a size-sealed memfd of the
// announced size (comm/colocate/segment.h) or finds the mapping kept from an earlier update
// (comm/colocate/segment_mappings.h), and copies each tensor of the manifest into one pool
// block, hashing every chunk while it is still in cache (one pass), then checks each digest
// against the request's. A device segment (segment.cuda_ipc) is opened from its CUDA IPC handle
// on CUDA device `cuda_device` instead (-1: the calling thread's current one; the thread's
// current device is left as it was), copied to host
// staging 1 MiB at a time, each piece hashed after its copy, and closed before returning
// (comm/colocate/cuda_ipc.h). The bucket's bytes are all copied when it returns: the trainer may
// reuse its buffer once the request is answered (a kept mapping may still be populated in the
// background, which reads no bytes into staging). Errors: ReceiverError 400 for a handle or segment
// that is not what the request says (forged, foreign, wrong size; a CUDA handle this process
// cannot open) or bytes whose digest differs,
// 504 when the trainer does not hand the descriptor over in time.
// Threading: a free function; call it without the receiver's lock.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "comm/colocate/segment_mappings.h"
#include "comm/deadline.h"
#include "sync/engine/stage/block_pool.h"
#include "sync/model/checksum.h"
#include "sync/protocol/tensor_update.h"

namespace weightcast::sync::engine {

struct SegmentTensor {
  SharedBytes bytes;  // a view of the block the bucket was copied into
  Digest digest;
};

// One entry per manifest tensor, in manifest order.
std::vector<SegmentTensor> copy_segment(const UpdateWeightsFromTensorRequest& request,
                                        const std::string& token, BlockPool& pool,
                                        comm::colocate::SegmentMappings& mappings,
                                        comm::Millis timeout, int cuda_device);

// The same copy from a bucket already in this process's memory (`bytes`, of the request's
// segment.size): the pickled form a Python receiver decoded when opted in. The request carries no
// digests; each tensor's digest is computed in the copy and recorded.
std::vector<SegmentTensor> copy_local(const UpdateWeightsFromTensorRequest& request,
                                      std::span<const std::byte> bytes, BlockPool& pool);

}  // namespace weightcast::sync::engine

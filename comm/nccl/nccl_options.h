// The NCCL backend's options.
#pragma once

namespace weightcast::comm {

struct NcclOptions {
  int cuda_device = -1;  // CUDA device ordinal to use (-1: the calling thread's current device)
};

}  // namespace weightcast::comm

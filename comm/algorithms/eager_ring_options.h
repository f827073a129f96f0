// The eager ring's options (comm/algorithms/eager_ring.h).
#pragma once

#include <cstddef>

namespace weightcast::comm {

struct EagerRingOptions {
  // Broadcasts of at most this many bytes skip Gloo and go down the chain's eager ring (one TCP
  // connection per rank to the next, progressed in the calling thread); 0 turns it off. Every
  // member must use the same value, like ChainOptions::chunk_bytes.
  std::size_t max_bytes = 16u << 20;
};

}  // namespace weightcast::comm

// The pipelined chain broadcast's options (comm/algorithms/chain.h): how a broadcast is cut and
// how much of it each link keeps in flight. Every member of a group must use the same chunk_bytes
// (checked when the group forms).
#pragma once

#include <cstddef>

namespace weightcast::comm {

struct ChainOptions {
  std::size_t chunk_bytes = 4u << 20;  // bytes per chunk
  int chunks_in_flight = 4;            // chunks kept in flight on each link
};

}  // namespace weightcast::comm

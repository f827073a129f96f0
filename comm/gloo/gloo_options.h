// The Gloo backend's options, one struct per algorithm it runs (as Gloo's own algorithms each take
// their options): the pipelined chain, the eager ring and same-host single copy.
#pragma once

#include <string>

#include "comm/algorithms/chain_options.h"
#include "comm/algorithms/eager_ring_options.h"
#include "comm/transport/single_copy_options.h"

namespace weightcast::comm {

struct GlooOptions {
  // The address the TCP transport (and the eager ring) binds and advertises to peers.
  std::string bind_address = "127.0.0.1";
  ChainOptions chain;
  EagerRingOptions eager_ring;
  SingleCopyOptions single_copy;
};

}  // namespace weightcast::comm

// The settings every member of a (non-torch) Gloo group must share: the chain's chunk_bytes, the
// eager ring's threshold and the single-copy minimum. Rank 0 publishes them in the group's store
// before the mesh forms; every other rank compares once the mesh formed and refuses a difference
// with ConfigError naming both values. Internal to the gloo backend; includes Gloo headers (through
// the adapter).
#pragma once

#include "comm/communicator.h"
#include "comm/gloo/gloo_store_adapter.h"

namespace weightcast::comm::gloo_backend {

void publish_group_settings(GlooStoreAdapter& store, const CommOptions& opts);

// Throws ConfigError when a setting of `opts` differs from rank 0's.
void check_group_settings(GlooStoreAdapter& store, const CommOptions& opts);

}  // namespace weightcast::comm::gloo_backend

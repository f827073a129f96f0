// EngineOptions: how weightcast-engine's control plane (sync/engine/control/engine.h) runs: rank
// count, timeouts, limits, what it may dial, sessionless rules and leases.
// Lifetime/threading: a plain value, copied into the Engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "sync/engine/commit/local_ranks.h"
#include "sync/engine/control/sessionless.h"
#include "sync/engine/receive/channel.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

struct EngineOptions {
  int rank_count = 1;            // engine ranks (TP size), each a group member
  bool legacy_finalize = false;  // reproduce the old finalize (re-transform everything)
  // Take colocated buckets (POST /update_weights_from_tensor, docs/colocated.md) and offer them
  // in /server_info (colocate_host); false: the route answers 403 and trainers use the chain.
  bool colocate = true;
  // Keep read-only mappings of trainer segments between updates while the trainer keeps them
  // (ReceiverOptions::keep_segment_mappings); false: map each bucket afresh and read it with pread.
  bool keep_segment_mappings = true;
  comm::Millis init_timeout{60000};
  comm::Millis comm_timeout{60000};     // each bucket's broadcast
  comm::Millis session_timeout{60000};  // a session idle this long is aborted
  std::size_t max_bucket_bytes = std::size_t{4} << 30;
  std::uint64_t max_buckets_ahead = 8;
  ConnectOptions connect;  // rank_count and init_timeout are taken from above
  GroupConnector connector = connect_group;
  std::optional<std::string> speculative_algorithm;
  ProtocolLimits limits;
  // master_address values init_weights_update_group may dial, compared as text (ASCII case
  // folded, names never resolved); anything else is refused with 403 before any connection.
  // Empty: any address.
  std::vector<std::string> allowed_master_addresses;
  // What an update request with no session open may touch (sync/engine/control/sessionless.h).
  SessionlessRules sessionless;
  // A holder's lease when its begin asks for no time to live (sync/engine/control/lease.h).
  comm::Millis lease_ttl{300000};
  // Expert parallelism over the engine's ranks, reported in /server_info (ep_size, and which
  // experts each rank holds); the runners keep every expert, shared by the ranks.
  ExpertParallel experts;
  // Shard plans (docs/sharding.md), one per engine rank, announced in /server_info: each rank
  // joins its shard class's groups and receives only its slices; the full tensors are put
  // together at commit. Empty: none announced, every rank receives whole tensors.
  std::vector<ShardPlan> shard_plans;
};

}  // namespace weightcast::sync::engine

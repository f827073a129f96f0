// The engine's data-plane endpoints: a BucketChannel per engine rank of a group, and
// connect_group(), which forms the group for all engine ranks at once.
//
// An engine with R ranks joins a group as members rank_offset .. rank_offset + R - 1 (see
// docs/architecture.md, "Groups and ranks"); each rank has its own communicator, as each TP
// worker of an inference engine does. Every bucket is one broadcast from group rank 0, so a
// channel only ever receives. The interface lets tests drive the receiver without sockets.
// Lifetime: channels are owned by their Group and die with it. Threading: receive() is called by
// one thread (the rank's receive thread); abort() may be called from any thread and makes a
// blocked receive() throw promptly.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "sync/protocol/protocol_enums.h"

namespace weightcast::sync::engine {

class BucketChannel {
 public:
  virtual ~BucketChannel() = default;
  // Fills `buffer` (`bytes` long, of kind memory()) with the next broadcast from group rank 0,
  // calling `on_received` (optional) as comm::BroadcastOptions::on_received says.
  // Throws comm::TimeoutError / comm::PeerError on failure; the channel is then aborted.
  virtual void receive(void* buffer, std::size_t bytes, comm::Millis timeout,
                       const comm::ReceivedFn& on_received) = 0;
  virtual void abort() = 0;
  virtual comm::MemoryKind memory() const = 0;
  virtual int group_rank() const = 0;
  // How the group's broadcasts reach this rank (comm::Communicator::data_path()).
  virtual std::string data_path() const = 0;
};

// What /init_weights_update_group asks for, plus the engine's own settings.
struct GroupSpec {
  std::string group_name;
  std::string master_address;
  int master_port = 0;
  int rank_offset = 1;
  int world_size = 2;
  Backend backend = Backend::kGloo;
  std::optional<Rendezvous> rendezvous =
      std::nullopt;  // absent: detected (sync/engine/receive/rendezvous.h)
  // InitWeightsUpdateGroupRequest::ranks: the engine ranks that join (ranks[i] at group rank
  // rank_offset + i); empty: every rank, at rank_offset + its engine rank.
  std::vector<int> ranks = {};
};

struct ConnectOptions {
  int rank_count = 1;
  comm::Millis init_timeout{60000};        // the whole join: store connection and rendezvous
  std::string bind_address = "127.0.0.1";  // the data-plane address this engine advertises
  std::string store_token;                 // the rendezvous store's token, if it has one
  // NCCL: engine rank i drives CUDA device base_gpu_id + i (SGLang's --base-gpu-id), so an engine
  // and a trainer, or two engines, can share a machine without sharing a GPU.
  int base_gpu_id = 0;
  // Gloo chain tuning (comm::CommOptions).
  std::size_t chunk_bytes = 4u << 20;
  int chunks_in_flight = 4;
  // Same-host single copy (comm::SingleCopyOptions::enabled); false keeps every group this engine
  // joins off it.
  bool single_copy = true;
  // comm::SingleCopyOptions::allow_same_user_reads: single copy under Yama ptrace_scope 1.
  bool allow_same_user_reads = false;
};

// Forms the group: one channel per engine rank, index i = group rank rank_offset + i.
using GroupConnector = std::function<std::vector<std::unique_ptr<BucketChannel>>(
    const GroupSpec&, const ConnectOptions&)>;

// The real connector: resolves the rendezvous kind (sync/engine/receive/rendezvous.h), then each
// engine rank, on its own thread, connects to the store at master_address:master_port and forms its
// communicator with comm::create_communicator(). Returns when every rank joined; throws
// comm::TimeoutError when the group does not form within init_timeout, comm::ConfigError for a
// backend this build lacks, comm::PeerError when the store or a peer fails. No rank is left joined
// after a throw.
std::vector<std::unique_ptr<BucketChannel>> connect_group(const GroupSpec& spec,
                                                          const ConnectOptions& opts);

// A channel over an existing communicator (its rank is the group rank).
std::unique_ptr<BucketChannel> make_comm_channel(std::unique_ptr<comm::Communicator> comm);

}  // namespace weightcast::sync::engine

// WeightGroup: the data-plane group of one trainer pipeline stage with every engine, as seen from
// its source (group rank 0).
//
// Setup follows docs/architecture.md ("Groups and ranks"): the source starts a TcpStoreServer on
// its bind address and an ephemeral port it keeps, sends /init_weights_update_group to all
// engines concurrently (rank_offset and world_size derived from each engine's rank_count, so
// engines of different sizes work), joins the rendezvous itself, then awaits every answer. If an
// engine refuses or fails its init, the store is stopped at once, which makes the rendezvous fail
// promptly instead of waiting for ranks that will never come.
// Lifetime: owns the store server and the communicator; the engines must outlive it. A group
// whose communicator was aborted (a failed update) is unusable: destroy() it and create a new
// one, which uses a new store server (new port) so no stale key is read.
// Threading: one owner thread; comm().abort() may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "comm/store/c10d_store.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/engine_api.h"

namespace weightcast::sync::trainer {

using CommunicatorFactory = std::function<std::unique_ptr<comm::Communicator>(
    std::string_view backend, const comm::CommOptions& options)>;

// rank_offset of each engine and the world size: 1 + sum of rank counts (rank 0 is the source).
// Every count must be >= 1 (comm::BadRequestError naming the engine index otherwise).
struct GroupRanks {
  std::vector<int> offsets;
  int world_size = 1;
};
GroupRanks group_ranks(std::span<const int> rank_counts);

// "<prefix>-pp_<stage>".
std::string group_name(std::string_view prefix, int stage);

struct GroupOptions {
  std::string name;
  Backend backend = Backend::kGloo;
  // Where the store and the source's data-plane endpoint listen; engines are told this address.
  std::string bind_address = "127.0.0.1";
  std::string token;            // the store's token (engines present their configured one)
  comm::Millis timeout{60000};  // rendezvous, and the default of every collective
  CommunicatorFactory factory;  // empty: comm::create_communicator
  int cuda_device = -1;         // NCCL: the source's device (-1: the calling thread's current)
  bool allow_same_user_reads = false;  // comm::SingleCopyOptions::allow_same_user_reads
  // Common mode (a group with SGLang/torch members): the source hosts a torch c10d store
  // (comm/store/c10d_store.h) instead of ours, joins it as torch rank 0 would, and forms a
  // torch-compatible group under the key chain of `torch_keys`. The token is not used (torch's
  // store has none).
  // kAuto (--torch-store auto): the torch members (engines without name_rendezvous) are sent
  // their init first; the generation the first of them speaks to the store is the group's, and
  // the other engines' inits name it ("torch1" / "torch2").
  bool torch = false;
  comm::C10dProtocol torch_protocol = comm::C10dProtocol::kAuto;
  // Per engine (same order as `engines`): whether its init names the rendezvous ("torch" or
  // "weightcast"). SGLang engines get none, as Miles sends none.
  std::vector<bool> name_rendezvous;
  // Per engine (same order as `engines`): the engine ranks that join, ascending
  // (InitWeightsUpdateGroupRequest::ranks); its rank count is then their number. Empty, or
  // shorter than `engines`: every rank.
  std::vector<std::vector<int>> ranks;
};

class WeightGroup {
 public:
  // Sets the group up as described above. Throws EngineCallError when an engine's init failed
  // (naming it), comm::TimeoutError / comm::PeerError when the rendezvous failed,
  // comm::ConfigError for a backend this build lacks.
  static std::unique_ptr<WeightGroup> create(std::span<EngineApi* const> engines,
                                             std::span<const int> rank_counts,
                                             const GroupOptions& options);
  ~WeightGroup();
  WeightGroup(const WeightGroup&) = delete;
  WeightGroup& operator=(const WeightGroup&) = delete;

  const std::string& name() const { return name_; }
  comm::Communicator& comm() { return *comm_; }
  // True once the communicator was aborted: the group cannot carry another update.
  bool broken() const { return comm_->aborted(); }
  std::uint16_t store_port() const;

  // Asks every engine to leave the group (failures are ignored: an engine that is gone has left)
  // and tears the communicator and the store down.
  void destroy(std::span<EngineApi* const> engines);

  struct Impl;  // the store server and the communicator (group.cc)

 private:
  explicit WeightGroup(std::unique_ptr<Impl> impl);
  std::string name_;
  std::unique_ptr<Impl> impl_;
  comm::Communicator* comm_ = nullptr;
};

}  // namespace weightcast::sync::trainer

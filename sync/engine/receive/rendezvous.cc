#include "sync/engine/receive/rendezvous.h"

#include <algorithm>

#include "comm/errors.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/torch_group.h"

namespace weightcast::sync::engine {

namespace {

comm::Millis left(comm::Deadline deadline) {
  return std::max(comm::Millis(1), comm::remaining(deadline));
}

comm::CommOptions base_options(std::shared_ptr<comm::Store> store, const GroupSpec& spec,
                               const ConnectOptions& opts, int engine_rank,
                               comm::Deadline deadline) {
  comm::CommOptions comm_opts = comm::member_options(
      std::move(store), spec.rank_offset + engine_rank, spec.world_size, left(deadline));
  comm_opts.gloo.bind_address = opts.bind_address;
  comm_opts.gloo.chain.chunk_bytes = opts.chunk_bytes;
  comm_opts.gloo.chain.chunks_in_flight = opts.chunks_in_flight;
  comm_opts.gloo.single_copy.enabled = opts.single_copy;
  comm_opts.gloo.single_copy.allow_same_user_reads = opts.allow_same_user_reads;
  // Engine rank i drives GPU base_gpu_id + i, as a TP worker of an engine started at that GPU
  // would.
  comm_opts.nccl.cuda_device = opts.base_gpu_id + engine_rank;
  return comm_opts;
}

std::unique_ptr<comm::Communicator> join_weightcast(const GroupSpec& spec,
                                                    const ConnectOptions& opts, int engine_rank,
                                                    comm::Deadline deadline) {
  comm::TcpStoreOptions store_opts;
  store_opts.host = spec.master_address;
  store_opts.port = static_cast<std::uint16_t>(spec.master_port);
  store_opts.token = opts.store_token;
  store_opts.connect_timeout = left(deadline);
  auto store = std::make_shared<comm::TcpStore>(store_opts);
  comm::CommOptions comm_opts =
      base_options(std::make_shared<comm::PrefixStore>(spec.group_name, std::move(store)), spec,
                   opts, engine_rank, deadline);
  return comm::create_communicator(to_string(spec.backend), comm_opts);
}

std::unique_ptr<comm::Communicator> join_torch(const GroupSpec& spec, const ConnectOptions& opts,
                                               comm::C10dProtocol protocol, int engine_rank,
                                               comm::Deadline deadline) {
  comm::C10dStoreOptions store_opts;
  store_opts.host = spec.master_address;
  store_opts.port = static_cast<std::uint16_t>(spec.master_port);
  store_opts.protocol = protocol;
  store_opts.connect_timeout = left(deadline);
  auto store = std::make_shared<comm::C10dStore>(store_opts);
  // Every torch rank counts itself in "init/"; the master waits for world_size of them.
  store->join_as_worker(left(deadline));
  const comm::TorchKeys keys = store->protocol() == comm::C10dProtocol::kTorch1
                                   ? comm::TorchKeys::kTorch1
                                   : comm::TorchKeys::kTorch2;
  comm::CommOptions comm_opts = base_options(
      comm::torch_group_store(std::move(store), spec.group_name, to_string(spec.backend), keys),
      spec, opts, engine_rank, deadline);
  comm_opts.torch_compatible = true;
  return comm::create_communicator(to_string(spec.backend), comm_opts);
}

}  // namespace

comm::Millis probe_budget(comm::Millis init_timeout) {
  return std::clamp(init_timeout / 4, comm::Millis(1), comm::Millis(2000));
}

RendezvousPlan detect_rendezvous(const GroupSpec& spec, const ConnectOptions& opts,
                                 comm::Deadline deadline) {
  if (spec.rendezvous == Rendezvous::kTorch1)
    return {Rendezvous::kTorch, comm::C10dProtocol::kTorch1};
  if (spec.rendezvous == Rendezvous::kTorch2)
    return {Rendezvous::kTorch, comm::C10dProtocol::kTorch2};
  if (spec.rendezvous) return {*spec.rendezvous, comm::C10dProtocol::kAuto};
  comm::TcpStoreOptions probe;
  probe.host = spec.master_address;
  probe.port = static_cast<std::uint16_t>(spec.master_port);
  probe.token = opts.store_token;
  probe.connect_timeout =
      std::min(probe_budget(opts.init_timeout), std::max(comm::Millis(1), left(deadline)));
  try {
    comm::TcpStore store(probe);  // answered our HELLO: our store
    return {Rendezvous::kWeightcast, comm::C10dProtocol::kAuto};
  } catch (const comm::ConfigError&) {
    throw;  // our store, refusing our token: report that, not a torch failure
  } catch (const comm::Error&) {
    // Dropped, stalled, garbled, or nobody listening yet: a torch store (or none at all, which
    // the torch join reports within the rest of the deadline).
    return {Rendezvous::kTorch, comm::C10dProtocol::kAuto};
  }
}

std::unique_ptr<comm::Communicator> join_rank(const GroupSpec& spec, const ConnectOptions& opts,
                                              const RendezvousPlan& plan, int engine_rank,
                                              comm::Deadline deadline) {
  if (plan.kind == Rendezvous::kTorch) {
    return join_torch(spec, opts, plan.protocol, engine_rank, deadline);
  }
  return join_weightcast(spec, opts, engine_rank, deadline);
}

}  // namespace weightcast::sync::engine

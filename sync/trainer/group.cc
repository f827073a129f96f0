#include "sync/trainer/group.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "comm/errors.h"
#include "comm/store/c10d_store_server.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/torch_group.h"
#include "sync/trainer/engine_calls.h"

namespace weightcast::sync::trainer {

GroupRanks group_ranks(std::span<const int> rank_counts) {
  GroupRanks ranks;
  for (std::size_t i = 0; i < rank_counts.size(); ++i) {
    if (rank_counts[i] < 1) {
      throw comm::BadRequestError("engine " + std::to_string(i) +
                                  ": rank_count must be >= 1 (got " +
                                  std::to_string(rank_counts[i]) + ")");
    }
    ranks.offsets.push_back(ranks.world_size);
    ranks.world_size += rank_counts[i];
  }
  return ranks;
}

std::string group_name(std::string_view prefix, int stage) {
  return std::string(prefix) + "-pp_" + std::to_string(stage);
}

struct WeightGroup::Impl {
  std::unique_ptr<comm::TcpStoreServer> server;  // native mode
  std::unique_ptr<comm::C10dStoreServer> torch;  // common mode
  std::unique_ptr<comm::Communicator> comm;

  std::uint16_t port() const { return server ? server->port() : torch->port(); }
  void stop() const {
    if (server) server->stop();
    if (torch) torch->stop();
  }
};

WeightGroup::WeightGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  comm_ = impl_->comm.get();
}

WeightGroup::~WeightGroup() {
  if (impl_->comm) impl_->comm->abort();
  impl_->stop();
}

std::uint16_t WeightGroup::store_port() const {
  return impl_->port();
}

namespace {

bool names_rendezvous(const GroupOptions& options, std::size_t engine) {
  return engine >= options.name_rendezvous.size() || options.name_rendezvous[engine];
}

// What a weightcast engine's init names: our store, or the torch store with the generation the
// group's torch members speak (kAuto: still unknown, the engine detects it).
Rendezvous rendezvous_for(const GroupOptions& options, comm::C10dProtocol protocol) {
  if (!options.torch) return Rendezvous::kWeightcast;
  if (protocol == comm::C10dProtocol::kTorch1) return Rendezvous::kTorch1;
  if (protocol == comm::C10dProtocol::kTorch2) return Rendezvous::kTorch2;
  return Rendezvous::kTorch;
}

// Sends init to engine `i` (asynchronously, as Miles does through Ray). An SGLang engine is
// first asked to leave a group of that name, errors ignored, as Miles does: one left over from
// a trainer that died would refuse the init. A failed init stops the store: that engine's ranks
// will not join, and a stopped store makes the source's rendezvous fail now rather than at its
// timeout.
std::future<void> send_init(EngineApi* engine, std::size_t i, const GroupRanks& ranks,
                            const GroupOptions& options, comm::C10dProtocol protocol,
                            const WeightGroup::Impl& store) {
  InitWeightsUpdateGroupRequest request;
  request.master_address = options.bind_address;
  request.master_port = store.port();
  request.rank_offset = ranks.offsets[i];
  request.world_size = ranks.world_size;
  request.group_name = options.name;
  request.backend = options.backend;
  if (i < options.ranks.size()) request.ranks = options.ranks[i];
  const bool named = names_rendezvous(options, i);
  if (named) request.rendezvous = rendezvous_for(options, protocol);
  return std::async(std::launch::async, [engine, request, named, &store] {
    if (!named) {
      try {
        engine->destroy_weights_update_group({request.group_name});
      } catch (const comm::Error&) {
        // "The group to be destroyed does not exist.": the usual answer.
      }
    }
    try {
      engine->init_weights_update_group(request);
    } catch (...) {
      store.stop();
      throw;
    }
  });
}

// --torch-store auto: the generation of the first torch member that spoke to the store (its
// first request tells: 2.x opens with VALIDATE). Only torch members have been sent their init
// when this runs, and the source has not connected yet, so the first connection is theirs.
comm::C10dProtocol peer_generation(const comm::C10dStoreServer& server,
                                   std::vector<std::future<void>>& inits, comm::Millis timeout) {
  const comm::Deadline deadline = comm::deadline_after(timeout);
  while (comm::Clock::now() < deadline) {
    const auto stats = server.stats();
    if (stats.torch2_connections > 0) return comm::C10dProtocol::kTorch2;
    if (stats.torch1_connections > 0) return comm::C10dProtocol::kTorch1;
    const bool all_answered = std::all_of(inits.begin(), inits.end(), [](auto& f) {
      return !f.valid() || f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    if (all_answered) break;  // every init failed (the store was stopped) or none was sent
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw comm::TimeoutError(
      "--torch-store auto: no torch member of the group reached the store "
      "within " +
      std::to_string(timeout.count()) +
      " ms to tell its torch generation; pass --torch-store torch1 or torch2");
}

// Client options (ClientOptions: comm::TcpStoreOptions or comm::C10dStoreOptions) for the
// source's own connection to the store `server` it just started.
template <typename ClientOptions, typename Server>
ClientOptions own_client_options(const Server& server, const GroupOptions& options) {
  ClientOptions client;
  client.host = options.bind_address;
  client.port = server.port();
  client.connect_timeout = options.timeout;
  return client;
}

// Starts the group's store on `impl`: torch's c10d store in common mode, else ours.
void start_store(WeightGroup::Impl& impl, const GroupOptions& options) {
  if (options.torch) {
    comm::C10dStoreServerOptions server_opts;
    server_opts.bind_address = options.bind_address;
    impl.torch = std::make_unique<comm::C10dStoreServer>(server_opts);
    return;
  }
  comm::TcpStoreServerOptions server_opts;
  server_opts.bind_address = options.bind_address;
  server_opts.token = options.token;
  impl.server = std::make_unique<comm::TcpStoreServer>(server_opts);
}

// The source's own view of the store `impl` runs; torch: joined as torch rank 0 would, under the
// key chain of `protocol` (kTorch1 or kTorch2).
std::shared_ptr<comm::Store> own_store(WeightGroup::Impl& impl, const GroupOptions& options,
                                       comm::C10dProtocol protocol) {
  if (options.torch) {
    auto client = own_client_options<comm::C10dStoreOptions>(*impl.torch, options);
    client.protocol = protocol;
    auto store = std::make_shared<comm::C10dStore>(client);
    store->join_as_worker(options.timeout);  // torch's master counts itself too
    const auto keys = protocol == comm::C10dProtocol::kTorch1 ? comm::TorchKeys::kTorch1
                                                              : comm::TorchKeys::kTorch2;
    return comm::torch_group_store(std::move(store), options.name, to_string(options.backend),
                                   keys);
  }
  auto store_opts = own_client_options<comm::TcpStoreOptions>(*impl.server, options);
  store_opts.token = options.token;
  return std::make_shared<comm::PrefixStore>(options.name,
                                             std::make_shared<comm::TcpStore>(store_opts));
}

// Sends every init and joins the group as its rank 0. Under --torch-store auto the torch members
// are sent theirs first and the others once their generation is known (sync/trainer/group.h).
std::unique_ptr<comm::Communicator> join(std::span<EngineApi* const> engines,
                                         const GroupRanks& ranks, const GroupOptions& options,
                                         WeightGroup::Impl& impl,
                                         std::vector<std::future<void>>& inits) {
  comm::C10dProtocol protocol = options.torch_protocol;
  inits.resize(engines.size());
  std::shared_ptr<comm::Store> store;
  if (!options.torch || protocol != comm::C10dProtocol::kAuto) {
    // Our own client connects first: once connected, a store stopped by a failed init fails its
    // waits at once (a client still connecting would retry until its timeout).
    store = own_store(impl, options, protocol);
    for (std::size_t i = 0; i < engines.size(); ++i) {
      inits[i] = send_init(engines[i], i, ranks, options, protocol, impl);
    }
  } else {
    for (std::size_t i = 0; i < engines.size(); ++i) {
      if (!names_rendezvous(options, i)) {
        inits[i] = send_init(engines[i], i, ranks, options, protocol, impl);
      }
    }
    protocol = peer_generation(*impl.torch, inits, options.timeout);
    store = own_store(impl, options, protocol);
    for (std::size_t i = 0; i < engines.size(); ++i) {
      if (!inits[i].valid()) inits[i] = send_init(engines[i], i, ranks, options, protocol, impl);
    }
  }
  comm::CommOptions comm_opts =
      comm::member_options(std::move(store), 0, ranks.world_size, options.timeout);
  comm_opts.torch_compatible = options.torch;
  comm_opts.gloo.bind_address = options.bind_address;
  comm_opts.nccl.cuda_device = options.cuda_device;
  comm_opts.gloo.single_copy.allow_same_user_reads = options.allow_same_user_reads;
  const std::string backend(to_string(options.backend));
  return options.factory ? options.factory(backend, comm_opts)
                         : comm::create_communicator(backend, comm_opts);
}

}  // namespace

std::unique_ptr<WeightGroup> WeightGroup::create(std::span<EngineApi* const> engines,
                                                 std::span<const int> rank_counts,
                                                 const GroupOptions& options) {
  WC_ENFORCE_EQ(engines.size(), rank_counts.size());
  WC_ENFORCE(!engines.empty(), "a group needs at least one engine");
  const GroupRanks ranks = group_ranks(rank_counts);

  auto impl = std::make_unique<Impl>();
  start_store(*impl, options);
  std::vector<std::future<void>> inits;
  std::exception_ptr join_error;
  try {
    impl->comm = join(engines, ranks, options, *impl, inits);
  } catch (...) {
    join_error = std::current_exception();
    // The engines still joining fail at once instead of at their deadline.
    impl->stop();
  }

  std::vector<EngineFailure> failures;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    if (!inits[i].valid()) continue;  // never sent (auto detection failed first)
    try {
      inits[i].get();
    } catch (...) {
      failures.push_back(current_failure(engines[i]->url(), "POST /init_weights_update_group"));
    }
  }
  if (!failures.empty()) {
    if (impl->comm) impl->comm->abort();
    throw_if_failed("group " + options.name + " setup failed", std::move(failures));
  }
  if (join_error) std::rethrow_exception(join_error);
  auto group = std::unique_ptr<WeightGroup>(new WeightGroup(std::move(impl)));
  group->name_ = options.name;
  return group;
}

void WeightGroup::destroy(std::span<EngineApi* const> engines) {
  impl_->comm->abort();
  DestroyWeightsUpdateGroupRequest request;
  request.group_name = name_;
  on_all_engines(
      engines, "POST /destroy_weights_update_group",
      [&request](EngineApi& engine, std::size_t) { engine.destroy_weights_update_group(request); });
  impl_->stop();
}

}  // namespace weightcast::sync::trainer

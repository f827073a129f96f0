#include "sync/trainer/group.h"

#include <future>

#include "comm/errors.h"
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

// Sends init to every engine at once. A failed init stops `server`: that engine's ranks will not
// join, and a stopped store makes the source's rendezvous fail now rather than at its timeout.
std::vector<std::future<void>> send_inits(std::span<EngineApi* const> engines,
                                          const GroupRanks& ranks, const GroupOptions& options,
                                          const WeightGroup::Impl& store) {
  std::vector<std::future<void>> inits;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    InitWeightsUpdateGroupRequest request;
    request.master_address = options.bind_address;
    request.master_port = store.port();
    request.rank_offset = ranks.offsets[i];
    request.world_size = ranks.world_size;
    request.group_name = options.name;
    request.backend = options.backend;
    if (i >= options.name_rendezvous.size() || options.name_rendezvous[i]) {
      request.rendezvous = options.torch ? Rendezvous::kTorch : Rendezvous::kWeightcast;
    }
    inits.push_back(std::async(std::launch::async, [engine = engines[i], request, &store] {
      try {
        engine->init_weights_update_group(request);
      } catch (...) {
        store.stop();
        throw;
      }
    }));
  }
  return inits;
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

// Starts the group's store on `impl` and returns the source's own view of it. Our own client
// connects first: once connected, a stopped server fails its waits at once (a client still
// connecting would retry until its timeout).
std::shared_ptr<comm::Store> host_store(WeightGroup::Impl& impl, const GroupOptions& options) {
  if (options.torch) {
    comm::C10dStoreServerOptions server_opts;
    server_opts.bind_address = options.bind_address;
    impl.torch = std::make_unique<comm::C10dStoreServer>(server_opts);
    auto client = own_client_options<comm::C10dStoreOptions>(*impl.torch, options);
    client.protocol = options.torch_protocol;
    auto store = std::make_shared<comm::C10dStore>(client);
    store->join_as_worker(options.timeout);  // torch's master counts itself too
    const auto keys = options.torch_protocol == comm::C10dProtocol::kTorch1
                          ? comm::TorchKeys::kTorch1
                          : comm::TorchKeys::kTorch2;
    return comm::torch_group_store(std::move(store), options.name, to_string(options.backend),
                                   keys);
  }
  comm::TcpStoreServerOptions server_opts;
  server_opts.bind_address = options.bind_address;
  server_opts.token = options.token;
  impl.server = std::make_unique<comm::TcpStoreServer>(server_opts);
  auto store_opts = own_client_options<comm::TcpStoreOptions>(*impl.server, options);
  store_opts.token = options.token;
  return std::make_shared<comm::PrefixStore>(options.name,
                                             std::make_shared<comm::TcpStore>(store_opts));
}

}  // namespace

std::unique_ptr<WeightGroup> WeightGroup::create(std::span<EngineApi* const> engines,
                                                 std::span<const int> rank_counts,
                                                 const GroupOptions& options) {
  WC_ENFORCE_EQ(engines.size(), rank_counts.size());
  WC_ENFORCE(!engines.empty(), "a group needs at least one engine");
  const GroupRanks ranks = group_ranks(rank_counts);

  auto impl = std::make_unique<Impl>();
  comm::CommOptions comm_opts =
      comm::member_options(host_store(*impl, options), 0, ranks.world_size, options.timeout);
  comm_opts.torch_compatible = options.torch;
  comm_opts.bind_address = options.bind_address;
  comm_opts.cuda_device = options.cuda_device;

  auto inits = send_inits(engines, ranks, options, *impl);
  std::exception_ptr join_error;
  try {
    const std::string backend(to_string(options.backend));
    impl->comm = options.factory ? options.factory(backend, comm_opts)
                                 : comm::create_communicator(backend, comm_opts);
  } catch (...) {
    join_error = std::current_exception();
  }

  std::vector<EngineFailure> failures;
  for (std::size_t i = 0; i < engines.size(); ++i) {
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

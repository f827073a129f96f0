// weightcast-bench hosts-worker: one host's process of the hosts mode (launcher/bench/hosts.h),
// started inside its namespace. Rank 0 hosts the store; every rank times the chain and the stock
// gloo broadcast and checks the bytes, and rank 0 prints one "result" line per backend.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/huge_pages.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "launcher/bench/hosts.h"
#include "launcher/bench/hosts_shard.h"
#include "launcher/cli_util.h"

namespace weightcast::launcher {

namespace {

// The worker's store: rank 0 hosts it in `server` and prints "store-port N"; every rank connects.
std::shared_ptr<comm::Store> worker_store(const HostsWorkerOptions& o,
                                          std::unique_ptr<comm::TcpStoreServer>& server) {
  int port = o.store_port;
  if (o.rank == 0) {
    comm::TcpStoreServerOptions so;
    so.bind_address = o.bind_address;
    server = std::make_unique<comm::TcpStoreServer>(so);
    port = server->port();
    std::printf("store-port %d\n", port);
    std::fflush(stdout);
  }
  comm::TcpStoreOptions co;
  co.host = o.store_host;
  co.port = static_cast<std::uint16_t>(port);
  co.connect_timeout = comm::Millis(o.timeout_ms);
  return std::make_shared<comm::PrefixStore>("hosts", std::make_shared<comm::TcpStore>(co));
}

// Every rank posts its #wrong; rank 0 prints "result NAME US TOTAL_WRONG".
void report_result(const HostsWorkerOptions& o, comm::Store& store, const std::string& name,
                   double us, unsigned long long wrong) {
  const std::string key = "wrong/" + name + "/" + std::to_string(o.rank);
  store.set(key, std::to_string(wrong), comm::Millis(o.timeout_ms));
  if (o.rank != 0) return;
  unsigned long long total = 0;
  for (int r = 1; r < o.size; ++r) {
    total += std::stoull(
        store.get("wrong/" + name + "/" + std::to_string(r), comm::Millis(o.timeout_ms)));
  }
  std::printf("result %s %.1f %llu\n", name.c_str(), us, total);
  std::fflush(stdout);
}

// One backend: a checked warm-up broadcast of random bytes, then `iters` timed ones.
void time_backend(const HostsWorkerOptions& o, comm::GlooCommunicator& comm_, comm::Store& store,
                  const std::string& backend, std::span<unsigned char> buf) {
  const bool stock = backend == "gloo-stock";
  if (!stock && backend != "gloo-chain") {
    throw std::invalid_argument("hosts-worker backends are gloo-chain and gloo-stock, not " +
                                backend);
  }
  auto run = [&] {
    comm::BroadcastOptions b{buf.data(), buf.size(), 0, comm::MemoryKind::kHost, {}, {}};
    stock ? comm_.broadcast_stock(b) : comm_.broadcast(b);
  };
  std::mt19937_64 rng(42);
  if (o.rank == 0) {
    for (auto& c : buf) c = static_cast<unsigned char>(rng());
  } else {
    std::fill(buf.begin(), buf.end(), 0xA5);
  }
  run();  // warm-up and correctness pass
  unsigned long long wrong = 0;
  if (o.rank != 0) {
    for (auto c : buf) wrong += c != static_cast<unsigned char>(rng());
  }
  comm_.barrier(comm::Millis(o.timeout_ms));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) run();
  comm_.barrier(comm::Millis(o.timeout_ms));  // the slowest receiver ends the measurement
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      o.iters;
  report_result(o, store, backend, us, wrong);
}

}  // namespace

int run_hosts_worker(const HostsWorkerOptions& o) {
  std::unique_ptr<comm::TcpStoreServer> server;
  auto store = worker_store(o, server);
  auto comm_ = hosts_communicator(o, store, o.rank, o.size);
  if (!o.shard_tps.empty()) {
    time_sharded(o, *comm_, store);
    comm_->barrier(comm::Millis(o.timeout_ms));
    return 0;
  }
  // Huge pages, as the update's source arena and engine blocks are: on one host the chain's single
  // copy reads small pages at about half the speed (docs/performance.md).
  std::vector<unsigned char, comm::HugePageAllocator<unsigned char>> buf(o.bytes);
  for (const std::string& backend : o.backends) time_backend(o, *comm_, *store, backend, buf);
  comm_->barrier(comm::Millis(o.timeout_ms));
  return 0;
}

std::vector<std::string> hosts_worker_argv(const std::string& self, const HostsWorkerOptions& w) {
  std::string backends, tps;
  for (const auto& b : w.backends) backends += (backends.empty() ? "" : ",") + b;
  for (int tp : w.shard_tps) tps += (tps.empty() ? "" : ",") + std::to_string(tp);
  // Empty lists (no backends, no TP sizes) are left out.
  return with_flags({self, "hosts-worker"}, {{"--rank", std::to_string(w.rank)},
                                             {"--size", std::to_string(w.size)},
                                             {"--bind", w.bind_address},
                                             {"--store-host", w.store_host},
                                             {"--store-port", std::to_string(w.store_port)},
                                             {"--bytes", std::to_string(w.bytes)},
                                             {"--iters", std::to_string(w.iters)},
                                             {"--chunk-bytes", std::to_string(w.chunk_bytes)},
                                             {"--in-flight", std::to_string(w.chunks_in_flight)},
                                             {"--timeout-ms", std::to_string(w.timeout_ms)},
                                             {"--single-copy", w.single_copy ? "1" : "0"},
                                             {"--bucket-bytes", std::to_string(w.bucket_bytes)},
                                             {"--backends", backends},
                                             {"--shard-tps", tps}});
}

}  // namespace weightcast::launcher

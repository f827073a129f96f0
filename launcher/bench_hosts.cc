#include "launcher/bench_hosts.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "launcher/cli_util.h"

namespace weightcast::launcher {
namespace {

constexpr const char* kBridgeNs = "wcbench-br";

std::string host_ns(int i) {
  return "wcbench-h" + std::to_string(i);
}
std::string host_addr(int i) {
  return "198.18.0." + std::to_string(i + 1);
}

int sh(const std::string& cmd, bool quiet = false) {
  std::string full = quiet ? cmd + " >/dev/null 2>&1" : cmd;
  return std::system(full.c_str());
}

void must(const std::string& cmd) {
  if (sh(cmd) != 0) throw std::runtime_error("command failed: " + cmd);
}

// Owns the namespaces: the destructor (and a signal) removes them all.
class Topology {
 public:
  explicit Topology(int hosts) : hosts_(hosts) { remove(hosts_); }
  ~Topology() { remove(hosts_); }

  void build(const std::string& rate) {
    must(std::string("ip netns add ") + kBridgeNs);
    must(std::string("ip -n ") + kBridgeNs + " link add br0 type bridge");
    must(std::string("ip -n ") + kBridgeNs + " link set br0 up");
    for (int i = 0; i < hosts_; ++i) {
      const std::string ns = host_ns(i), port = "p" + std::to_string(i);
      must("ip netns add " + ns);
      must("ip -n " + ns + " link set lo up");
      must("ip -n " + ns + " link add eth0 type veth peer name " + port + " netns " + kBridgeNs);
      must("ip -n " + ns + " addr add " + host_addr(i) + "/24 dev eth0");
      must("ip -n " + ns + " link set eth0 up");
      must(std::string("ip -n ") + kBridgeNs + " link set " + port + " master br0 up");
      // Full-duplex link of `rate`: shape the host's upload and its download.
      const std::string tbf = " root tbf rate " + rate + " burst 512kb latency 100ms";
      must("ip netns exec " + ns + " tc qdisc add dev eth0" + tbf);
      must(std::string("ip netns exec ") + kBridgeNs + " tc qdisc add dev " + port + tbf);
    }
  }

  static void remove(int hosts) {
    for (int i = 0; i < hosts; ++i) sh("ip netns del " + host_ns(i), true);
    sh(std::string("ip netns del ") + kBridgeNs, true);
  }

 private:
  int hosts_;
};

int g_hosts_for_signal = 0;
void on_signal(int sig) {
  Topology::remove(g_hosts_for_signal);
  signal(sig, SIG_DFL);
  raise(sig);
}

double rate_bytes_per_s(const std::string& rate) {
  double v = std::atof(rate.c_str());
  if (rate.find("gbit") != std::string::npos) return v * 1e9 / 8;
  if (rate.find("mbit") != std::string::npos) return v * 1e6 / 8;
  if (rate.find("kbit") != std::string::npos) return v * 1e3 / 8;
  throw std::invalid_argument("--rate must end in kbit, mbit or gbit: " + rate);
}

}  // namespace

int run_hosts_bench(const HostsBenchOptions& o, const std::string& self_exe) {
  const int hosts = o.receivers + 1;
  const double link = rate_bytes_per_s(o.rate);
  if (sh(std::string("ip netns add ") + kBridgeNs + "-probe", true) != 0) {
    std::printf(
        "# hosts: skipped (cannot create network namespaces here: needs root and "
        "CAP_NET_ADMIN)\n");
    return 0;
  }
  sh(std::string("ip netns del ") + kBridgeNs + "-probe", true);

  Topology topo(hosts);
  g_hosts_for_signal = hosts;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  topo.build(o.rate);

  auto worker_cmd = [&](int rank, int port) {
    char buf[1024];
    std::snprintf(buf, sizeof(buf),
                  "ip netns exec %s %s hosts-worker --rank %d --size %d --bind %s --store-host %s "
                  "--store-port %d --bytes %llu --iters %d --chunk-bytes %llu --in-flight %d "
                  "--timeout-ms %d",
                  host_ns(rank).c_str(), self_exe.c_str(), rank, hosts, host_addr(rank).c_str(),
                  host_addr(0).c_str(), port, static_cast<unsigned long long>(o.bytes), o.iters,
                  static_cast<unsigned long long>(o.chunk_bytes), o.chunks_in_flight, o.timeout_ms);
    return std::string(buf);
  };

  FILE* root = popen(worker_cmd(0, 0).c_str(), "r");
  if (!root) throw std::runtime_error("cannot start the root worker");
  char line[512];
  int port = 0;
  while (port == 0 && std::fgets(line, sizeof(line), root)) {
    std::sscanf(line, "store-port %d", &port);
  }
  if (port == 0) {
    pclose(root);
    throw std::runtime_error("root worker did not report its store port");
  }
  std::vector<FILE*> others;
  for (int r = 1; r < hosts; ++r) others.push_back(popen(worker_cmd(r, port).c_str(), "r"));

  std::printf(
      "# weightcast-bench hosts: root + %d receivers, each link %s (%.3f GB/s), %s per "
      "broadcast, %d iters, chunk %s x %d\n",
      o.receivers, o.rate.c_str(), link / 1e9, format_bytes(o.bytes).c_str(), o.iters,
      format_bytes(o.chunk_bytes).c_str(), o.chunks_in_flight);
  std::printf("%-11s %12s %12s %14s %8s\n", "backend", "time(us)", "algbw(GB/s)", "x link rate",
              "#wrong");
  int rc = 0;
  while (std::fgets(line, sizeof(line), root)) {
    char name[64];
    double us = 0;
    unsigned long long wrong = 0;
    if (std::sscanf(line, "result %63s %lf %llu", name, &us, &wrong) == 3) {
      double algbw = static_cast<double>(o.bytes) / (us * 1e-6);
      std::printf("%-11s %12.0f %12.4f %13.2fx %8llu\n", name, us, algbw / 1e9, algbw / link,
                  wrong);
      if (wrong) rc = 1;
    } else {
      std::fputs(line, stdout);
    }
    std::fflush(stdout);
  }
  if (pclose(root) != 0) rc = 1;
  for (FILE* f : others) {
    while (std::fgets(line, sizeof(line), f)) std::fputs(line, stderr);
    if (pclose(f) != 0) rc = 1;
  }
  return rc;
}

int run_hosts_worker(const HostsWorkerOptions& o) {
  std::unique_ptr<comm::TcpStoreServer> server;
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
  auto store = std::make_shared<comm::PrefixStore>("hosts", std::make_shared<comm::TcpStore>(co));
  comm::CommOptions opts;
  opts.store = store;
  opts.rank = o.rank;
  opts.size = o.size;
  opts.timeout = comm::Millis(o.timeout_ms);
  opts.bind_address = o.bind_address;
  opts.chunk_bytes = o.chunk_bytes;
  opts.chunks_in_flight = o.chunks_in_flight;
  auto comm_ = comm::create_gloo_communicator(opts);

  std::vector<unsigned char> buf(o.bytes);
  for (const std::string& backend : o.backends) {
    const char* name = backend.c_str();
    const bool stock = backend == "gloo-stock";
    if (!stock && backend != "gloo-chain") {
      throw std::invalid_argument("hosts-worker backends are gloo-chain and gloo-stock, not " +
                                  backend);
    }
    auto run = [&] {
      comm::BroadcastOptions b{buf.data(), buf.size(), 0, comm::MemoryKind::kHost, {}};
      stock ? comm_->broadcast_stock(b) : comm_->broadcast(b);
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
    comm_->barrier(comm::Millis(o.timeout_ms));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) run();
    comm_->barrier(comm::Millis(o.timeout_ms));  // the slowest receiver ends the measurement
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        o.iters;
    const std::string key = std::string("wrong/") + name + "/" + std::to_string(o.rank);
    store->set(key, std::to_string(wrong), comm::Millis(o.timeout_ms));
    if (o.rank == 0) {
      unsigned long long total = 0;
      for (int r = 1; r < o.size; ++r) {
        total += std::stoull(store->get(std::string("wrong/") + name + "/" + std::to_string(r),
                                        comm::Millis(o.timeout_ms)));
      }
      std::printf("result %s %.1f %llu\n", name, us, total);
      std::fflush(stdout);
    }
  }
  comm_->barrier(comm::Millis(o.timeout_ms));
  return 0;
}

}  // namespace weightcast::launcher

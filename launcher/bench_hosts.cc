#include "launcher/bench_hosts.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "launcher/bench_update.h"
#include "launcher/child_process.h"
#include "launcher/cli_util.h"
#include "sync/model/model.h"

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

namespace {

std::vector<std::string> in_ns(const std::string& ns, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"ip", "netns", "exec", ns});
  return argv;
}

// Root + receivers in their namespaces, one hosts-worker each; returns (backend, us, wrong) rows.
void measure_broadcast(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                       double link, std::map<std::string, double>& gbps) {
  const int hosts = o.receivers + 1;
  auto worker = [&](int rank, int port) {
    return in_ns(host_ns(rank), {self,
                                 "hosts-worker",
                                 "--rank",
                                 std::to_string(rank),
                                 "--size",
                                 std::to_string(hosts),
                                 "--bind",
                                 host_addr(rank),
                                 "--store-host",
                                 host_addr(0),
                                 "--store-port",
                                 std::to_string(port),
                                 "--bytes",
                                 std::to_string(o.bytes),
                                 "--iters",
                                 std::to_string(o.iters),
                                 "--chunk-bytes",
                                 std::to_string(o.chunk_bytes),
                                 "--in-flight",
                                 std::to_string(o.chunks_in_flight),
                                 "--timeout-ms",
                                 std::to_string(o.timeout_ms)});
  };
  const std::chrono::milliseconds timeout(o.timeout_ms);
  ChildProcess root(worker(0, 0));
  int port = 0;
  std::sscanf(root.line_starting("store-port ", timeout, "hosts root").c_str(), "store-port %d",
              &port);
  std::vector<std::unique_ptr<ChildProcess>> others;
  for (int r = 1; r < hosts; ++r) others.push_back(std::make_unique<ChildProcess>(worker(r, port)));
  for (std::size_t b = 0; b < 2; ++b) {
    char name[64];
    double us = 0;
    unsigned long long wrong = 0;
    const std::string l = root.line_starting("result ", timeout, "hosts broadcast");
    if (std::sscanf(l.c_str(), "result %63s %lf %llu", name, &us, &wrong) != 3) {
      throw std::runtime_error("hosts root said: " + l);
    }
    const double algbw = static_cast<double>(o.bytes) / (us * 1e-6);
    table.add({std::string(name), o.bytes, us, algbw / 1e9, algbw / link,
               static_cast<std::uint64_t>(wrong)});
    gbps[name] = algbw / 1e9;
  }
  if (root.wait_exit(timeout) != 0) throw std::runtime_error("hosts root worker failed");
  for (auto& w : others) {
    if (w->wait_exit(timeout) != 0) throw std::runtime_error("a hosts receiver failed");
  }
}

// The end-to-end update between the namespaces: an engine in each receiver host, the update
// bench as the source in host 0, the same links.
void measure_update(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                    double link, double chain_gbps) {
  UpdateBenchOptions uo;
  uo.model_bytes = o.update_model_bytes;
  uo.bucket_bytes = o.update_bucket_bytes;
  uo.chunk_bytes = o.chunk_bytes;
  uo.iters = o.iters;
  uo.timeout_ms = o.timeout_ms;
  const TempFile spec_file = write_model_spec(uo.model_bytes);
  const std::string& spec = spec_file.path();
  const std::uint64_t model =
      sync::total_bytes(sync::hf_tensors(sync::model_spec_for_bytes(uo.model_bytes)));
  const bool both = o.update_drift == "realistic";
  std::vector<std::unique_ptr<ChildProcess>> engines;
  std::string urls[2];  // the delta set (or the only one), the full set
  for (int set = 0; set < (both ? 2 : 1); ++set) {
    for (int r = 1; r <= o.receivers; ++r) {
      engines.push_back(std::make_unique<ChildProcess>(
          in_ns(host_ns(r), update_engine_argv(uo, self, spec, model, host_addr(r)))));
      urls[set] += (urls[set].empty() ? "" : ",") +
                   engine_url(*engines.back(), std::chrono::milliseconds(o.timeout_ms));
    }
  }
  const TempFile json_file("weightcast-bench-hosts-update", "");
  const std::string& json = json_file.path();
  std::vector<std::string> argv = {self,
                                   "update",
                                   "--engine-urls",
                                   urls[0],
                                   "--bind",
                                   host_addr(0),
                                   "--model-bytes",
                                   std::to_string(uo.model_bytes),
                                   "--bucket-bytes",
                                   std::to_string(uo.bucket_bytes),
                                   "--chunk-bytes",
                                   std::to_string(uo.chunk_bytes),
                                   "--iters",
                                   std::to_string(o.iters),
                                   "--timeout-ms",
                                   std::to_string(o.timeout_ms),
                                   "--no-raw",
                                   "--json",
                                   json};
  if (both) {
    argv.insert(argv.end(), {"--drift", "realistic", "--delta", "auto", "--compare-full",
                             "--full-engine-urls", urls[1]});
  }
  ChildProcess source(in_ns(host_ns(0), argv));
  const int rc = source.wait_exit(std::chrono::milliseconds(o.timeout_ms) * (o.iters + 2));
  std::ifstream in(json);
  const auto result = nlohmann::json::parse(in, nullptr, false);
  if (rc != 0 || result.is_discarded()) {
    throw std::runtime_error("the update source in " + host_ns(0) + " failed (exit " +
                             std::to_string(rc) + ")");
  }
  for (const auto& row : result["rows"]) {
    const double gbps = row["GB/s"].get<double>();
    const std::string mode = row.contains("mode") ? row["mode"].get<std::string>() : "";
    table.add({"update " + mode + " " + row["step"].get<std::string>(), model,
               row["seconds"].get<double>() * 1e6, gbps, gbps * 1e9 / link,
               row["#wrong"].get<std::uint64_t>()});
    if (row["step"] != "1") {
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "update %s step %s: %.2fx the link rate, %.2fx the raw chain on the same links",
                    mode.c_str(), row["step"].get<std::string>().c_str(), gbps * 1e9 / link,
                    gbps / chain_gbps);
      table.note(buf);
    }
  }
  for (const auto& n : result["notes"]) table.note("source: " + n.get<std::string>());
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

  BenchTable table("hosts", {{"what", 16, 0},
                             {"bytes", 11, 0},
                             {"time(us)", 12, 0},
                             {"algbw(GB/s)", 12, 4},
                             {"x link rate", 12, 2},
                             {"#wrong", 7, 0}});
  char head[256];
  std::snprintf(head, sizeof(head),
                "weightcast-bench hosts: root + %d receivers, each link %s (%.3f GB/s), %s per "
                "broadcast, %d iters, chunk %s x %d",
                o.receivers, o.rate.c_str(), link / 1e9, format_bytes(o.bytes).c_str(), o.iters,
                format_bytes(o.chunk_bytes).c_str(), o.chunks_in_flight);
  table.note(head);
  table.print_header();
  std::map<std::string, double> gbps;
  measure_broadcast(o, self_exe, table, link, gbps);
  if (o.update_model_bytes > 0) measure_update(o, self_exe, table, link, gbps["gloo-chain"]);
  table.write(o.output);
  for (const auto& row : table.rows()) {
    if (std::get<std::uint64_t>(row[5]) != 0) return 1;
  }
  return 0;
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

#include "launcher/bench/hosts.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "launcher/bench/engines.h"
#include "launcher/bench/hosts_ep.h"
#include "launcher/bench/hosts_net.h"
#include "launcher/bench/hosts_shard.h"
#include "launcher/bench/hosts_shard_update.h"
#include "launcher/bench/update.h"
#include "launcher/child_process.h"
#include "launcher/cli_util.h"
#include "sync/model/model.h"

namespace weightcast::launcher {
namespace {

constexpr const char* kBridgeNs = "wcbench-br";

// `rate` (the value of `option`) in bytes per second.
double rate_bytes_per_s(const std::string& rate, const std::string& option = "--rate") {
  double v = std::atof(rate.c_str());
  if (rate.find("gbit") != std::string::npos) return v * 1e9 / 8;
  if (rate.find("mbit") != std::string::npos) return v * 1e6 / 8;
  if (rate.find("kbit") != std::string::npos) return v * 1e3 / 8;
  throw std::invalid_argument(option + " must end in kbit, mbit or gbit: " + rate);
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
      shape(i, "add", rate);
    }
  }

  // Host i's link to `rate` from now on.
  void set_rate(int i, const std::string& rate) { shape(i, "change", rate); }

  static void remove(int hosts) {
    for (int i = 0; i < hosts; ++i) sh("ip netns del " + host_ns(i), true);
    sh(std::string("ip netns del ") + kBridgeNs, true);
  }

 private:
  // Full-duplex link of `rate`: shape the host's upload and its download. The burst holds at least
  // 4 ms of the rate (tbf needs one timer tick's worth to reach it).
  static void shape(int i, const std::string& verb, const std::string& rate) {
    const auto burst_kb =
        std::max<long long>(512, static_cast<long long>(rate_bytes_per_s(rate) * 0.004 / 1024));
    const std::string tbf =
        " root tbf rate " + rate + " burst " + std::to_string(burst_kb) + "kb latency 100ms";
    must("ip netns exec " + host_ns(i) + " tc qdisc " + verb + " dev eth0" + tbf);
    must(std::string("ip netns exec ") + kBridgeNs + " tc qdisc " + verb + " dev p" +
         std::to_string(i) + tbf);
  }

  int hosts_;
};

int g_hosts_for_signal = 0;
void on_signal(int sig) {
  Topology::remove(g_hosts_for_signal);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

std::string host_ns(int i) {
  return "wcbench-h" + std::to_string(i);
}
std::string host_addr(int i) {
  return "198.18.0." + std::to_string(i + 1);
}
std::string hosts_subnet() {
  return "198.18.0.0/24";
}
std::vector<std::string> in_ns(const std::string& ns, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"ip", "netns", "exec", ns});
  return argv;
}

namespace {

// Root + receivers in their namespaces, one hosts-worker each: the backends, or (with
// `shard_tps`) the sharded broadcast.
struct HostWorkers {
  std::unique_ptr<ChildProcess> root;
  std::vector<std::unique_ptr<ChildProcess>> others;

  HostWorkers(const HostsBenchOptions& o, const std::string& self,
              const std::vector<int>& shard_tps) {
    auto worker = [&](int rank, int port) {
      HostsWorkerOptions w;
      w.rank = rank;
      w.size = o.receivers + 1;
      w.bind_address = host_addr(rank);
      w.store_host = host_addr(0);
      w.store_port = port;
      w.bytes = o.bytes;
      w.iters = o.iters;
      w.chunk_bytes = o.chunk_bytes;
      w.chunks_in_flight = o.chunks_in_flight;
      w.timeout_ms = o.timeout_ms;
      if (!shard_tps.empty()) {
        w.backends.clear();
        w.shard_tps = shard_tps;
        w.bucket_bytes = o.shard_bucket_bytes;
      }
      return in_ns(host_ns(rank), hosts_worker_argv(self, w));
    };
    root = std::make_unique<ChildProcess>(worker(0, 0));
    int port = 0;
    std::sscanf(
        root->line_starting("store-port ", std::chrono::milliseconds(o.timeout_ms), "hosts root")
            .c_str(),
        "store-port %d", &port);
    for (int r = 1; r <= o.receivers; ++r) {
      others.push_back(std::make_unique<ChildProcess>(worker(r, port)));
    }
  }

  void wait(std::chrono::milliseconds timeout) {
    if (root->wait_exit(timeout) != 0) throw std::runtime_error("hosts root worker failed");
    for (auto& w : others) {
      if (w->wait_exit(timeout) != 0) throw std::runtime_error("a hosts receiver failed");
    }
  }
};

// The backends' rows: (backend, us, wrong) from the root.
void measure_broadcast(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                       double link, std::map<std::string, double>& gbps) {
  const std::chrono::milliseconds timeout(o.timeout_ms);
  HostWorkers workers(o, self, {});
  ChildProcess& root = *workers.root;
  for (std::size_t b = 0; b < 2; ++b) {
    char name[64];
    double us = 0;
    unsigned long long wrong = 0;
    const std::string l = root.line_starting("result ", timeout, "hosts broadcast");
    if (std::sscanf(l.c_str(), "result %63s %lf %llu", name, &us, &wrong) != 3) {
      throw std::runtime_error("hosts root said: " + l);
    }
    const double algbw = static_cast<double>(o.bytes) / (us * 1e-6);
    table.add({std::string(name), o.bytes, us, algbw / 1e9, algbw / link},
              static_cast<std::uint64_t>(wrong));
    gbps[name] = algbw / 1e9;
  }
  workers.wait(timeout);
}

// Shard-aware against full broadcast (launcher/bench/hosts_shard.h), host 0's link at the
// source rate.
void measure_sharded(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                     double link) {
  HostWorkers workers(o, self, o.shard_tps);
  add_sharded_rows(o, *workers.root, table, link);
  workers.wait(std::chrono::milliseconds(o.timeout_ms));
}

// Engines of the hosts mode: one per receiving host in each set, and each set's URLs.
struct HostEngines {
  std::vector<std::unique_ptr<ChildProcess>> processes;
  std::string urls[2];  // the delta set (or the only one), the full set
};

HostEngines start_host_engines(const HostsBenchOptions& o, const UpdateBenchOptions& uo,
                               const std::string& self, const std::string& spec,
                               std::uint64_t model, int sets) {
  HostEngines engines;
  for (int set = 0; set < sets; ++set) {
    for (int r = 1; r <= o.receivers; ++r) {
      engines.processes.push_back(std::make_unique<ChildProcess>(
          in_ns(host_ns(r), update_engine_argv(uo, self, spec, model, host_addr(r))),
          engine_child()));
      engines.urls[set] +=
          (engines.urls[set].empty() ? "" : ",") +
          engine_url(*engines.processes.back(), std::chrono::milliseconds(o.timeout_ms));
    }
  }
  return engines;
}

// The update bench as the source in host 0, writing its results to `json`; with `both`, on
// drifted weights against the delta and the full set.
std::vector<std::string> update_source_argv(const HostsBenchOptions& o,
                                            const UpdateBenchOptions& uo, const std::string& self,
                                            const HostEngines& engines, const std::string& json,
                                            bool both) {
  std::vector<std::string> argv =
      with_flags({self, "update", "--no-raw"}, {{"--engine-urls", engines.urls[0]},
                                                {"--bind", host_addr(0)},
                                                {"--model-bytes", std::to_string(uo.model_bytes)},
                                                {"--bucket-bytes", std::to_string(uo.bucket_bytes)},
                                                {"--chunk-bytes", std::to_string(uo.chunk_bytes)},
                                                {"--iters", std::to_string(o.iters)},
                                                {"--timeout-ms", std::to_string(o.timeout_ms)},
                                                {"--json", json}});
  if (both) {
    argv.insert(argv.end(), {"--drift", "realistic", "--delta", "auto", "--compare-full",
                             "--full-engine-urls", engines.urls[1]});
  }
  return argv;
}

// The source's rows and notes, in this table, against the link rate and the raw chain.
void add_update_rows(BenchTable& table, const nlohmann::json& result, std::uint64_t model,
                     double link, double chain_gbps) {
  for (const auto& row : result["rows"]) {
    const double gbps = row["GB/s"].get<double>();
    const std::string mode = row.contains("mode") ? row["mode"].get<std::string>() : "";
    table.add({"update " + mode + " " + row["step"].get<std::string>(), model,
               row["seconds"].get<double>() * 1e6, gbps, gbps * 1e9 / link},
              row["#wrong"].get<std::uint64_t>());
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
  const std::uint64_t model =
      sync::total_bytes(sync::hf_tensors(sync::model_spec_for_bytes(uo.model_bytes)));
  const bool both = o.update_drift == "realistic";
  const HostEngines engines =
      start_host_engines(o, uo, self, spec_file.path(), model, both ? 2 : 1);
  const TempFile json_file("weightcast-bench-hosts-update", "");
  ChildProcess source(
      in_ns(host_ns(0), update_source_argv(o, uo, self, engines, json_file.path(), both)));
  const int rc = source.wait_exit(std::chrono::milliseconds(o.timeout_ms) * (o.iters + 2));
  std::ifstream in(json_file.path());
  const auto result = nlohmann::json::parse(in, nullptr, false);
  if (rc != 0 || result.is_discarded()) {
    throw std::runtime_error("the update source in " + host_ns(0) + " failed (exit " +
                             std::to_string(rc) + ")");
  }
  add_update_rows(table, result, model, link, chain_gbps);
}

}  // namespace

int run_hosts_bench(const HostsBenchOptions& o, const std::string& self_exe) {
  const int hosts = std::max(o.receivers + 1, trainer_ep_hosts(o));
  const double link = rate_bytes_per_s(o.rate);
  if (!o.shard_source_rate.empty()) {
    rate_bytes_per_s(o.shard_source_rate, "--shard-source-rate");  // checked up front
  }
  for (const auto& [flag, tps] : {std::pair{"--shard-tps", &o.shard_tps},
                                  std::pair{"--shard-update-tps", &o.shard_update_tps}}) {
    for (int tp : *tps) {
      if (o.receivers % tp != 0) {
        throw std::invalid_argument(std::string(flag) + ": TP " + std::to_string(tp) +
                                    " does not divide --receivers " + std::to_string(o.receivers));
      }
    }
  }
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

  BenchTable table("hosts", {{"what", 20, 0},
                             {"bytes", 11, 0},
                             {"time(us)", 12, 0},
                             {"algbw(GB/s)", 12, 4},
                             {"x link rate", 12, 2}});
  char head[256];
  std::snprintf(head, sizeof(head),
                "weightcast-bench hosts: root + %d receivers, each link %s (%.3f GB/s), %s per "
                "broadcast, %d iters, chunk %s x %d",
                o.receivers, o.rate.c_str(), link / 1e9, format_bytes(o.bytes).c_str(), o.iters,
                format_bytes(o.chunk_bytes).c_str(), o.chunks_in_flight);
  table.begin(head);
  std::map<std::string, double> gbps;
  measure_broadcast(o, self_exe, table, link, gbps);
  if (o.update_model_bytes > 0) measure_update(o, self_exe, table, link, gbps["gloo-chain"]);
  if (o.trainer_ep > 0) measure_trainer_ep(o, self_exe, table, link);
  if (!o.shard_tps.empty() || !o.shard_update_tps.empty()) {
    int largest = 1;
    for (int tp : o.shard_tps) largest = std::max(largest, tp);
    for (int tp : o.shard_update_tps) largest = std::max(largest, tp);
    const std::string source_rate =
        !o.shard_source_rate.empty()
            ? o.shard_source_rate
            : std::to_string(static_cast<long long>(link * 8 / 1e3 * largest)) + "kbit";
    topo.set_rate(0, source_rate);
    table.note("sharded: " + std::to_string(o.receivers) + " engine ranks, a host each, links " +
               o.rate + "; the source's link " + source_rate + "; " +
               format_bytes(o.shard_bucket_bytes) + " buckets");
    if (!o.shard_tps.empty()) {
      table.note("sharded broadcast: " + format_bytes(o.bytes) + " model (hand-written TP plans)");
      measure_sharded(o, self_exe, table, link);
    }
    if (!o.shard_update_tps.empty()) {
      table.note("sharded update: torch engines (recorded plans), model " + o.shard_update_model);
      measure_sharded_update(o, self_exe, table, link);
    }
  }
  table.write(o.output);
  return table.wrong() ? 1 : 0;
}

}  // namespace weightcast::launcher

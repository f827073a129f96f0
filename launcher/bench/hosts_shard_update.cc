#include "launcher/bench/hosts_shard_update.h"

#include <fcntl.h>
#include <httplib.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launcher/bench/engines.h"
#include "launcher/bench/hosts_ep.h"
#include "launcher/bench/hosts_net.h"
#include "launcher/child_process.h"
#include "launcher/cli_util.h"

namespace weightcast::launcher {
namespace {

// Where the weightcast package is: the environment's PYTHONPATH, else the build tree's.
std::string python_path(const std::string& self) {
  const char* env = std::getenv("PYTHONPATH");
  return env != nullptr && *env != '\0' ? env : beside_self(self, "../python");
}

std::string seconds_arg(int ms) {
  return std::to_string(static_cast<double>(ms) / 1000);
}

// Engine `e` of TP `tp`: its front in host 0, worker k in host 1 + e*tp + k.
std::unique_ptr<ChildProcess> start_torch_engine(const HostsBenchOptions& o,
                                                 const std::string& self, int tp, int e) {
  std::string netns, addresses;
  for (int k = 0; k < tp; ++k) {
    const int host = 1 + e * tp + k;
    netns += (k ? "," : "") + host_ns(host);
    addresses += (k ? "," : "") + host_addr(host);
  }
  std::vector<std::string> argv =
      with_flags({o.python, "-m", "weightcast.reference", "--shard-plan", "recorded"},
                 {{"--tp", std::to_string(tp)},
                  {"--model", o.shard_update_model},
                  {"--seed", "1"},
                  {"--tp-host", host_addr(0)},
                  {"--worker-netns", netns},
                  {"--worker-bind-addresses", addresses},
                  {"--init-timeout", seconds_arg(o.timeout_ms)},
                  {"--comm-timeout", seconds_arg(o.timeout_ms)},
                  {"--session-timeout", seconds_arg(o.timeout_ms)}});
  argv.push_back("--debug-routes");  // /debug/info: what each worker received
  ChildOptions co = engine_child();
  co.own_group = true;  // its workers go with it
  // The workers' TP group (torch's Gloo) on their host's link, not the machine's name.
  co.extra_env = {"PYTHONPATH=" + python_path(self), "GLOO_SOCKET_IFNAME=eth0",
                  "PYTHONDONTWRITEBYTECODE=1"};
  return std::make_unique<ChildProcess>(in_ns(host_ns(0), std::move(argv)), std::move(co));
}

// The URL the reference engine prints once it serves ("...: serving on http://H:P (...)").
std::string torch_engine_url(ChildProcess& engine, std::chrono::milliseconds timeout) {
  const auto line = engine.wait_for_line("weightcast.reference: serving on ", timeout);
  if (!line) {
    throw std::runtime_error("the torch reference engine did not start in time; its output:\n" +
                             engine.output());
  }
  const auto end = line->find(' ');
  return line->substr(0, end);
}

// GET `path` from `url`, an engine front listening inside host 0's namespace: from a thread of
// its own that enters that namespace (a network namespace is per thread), so this process stays
// where it is.
nlohmann::json get_in_host0(const std::string& url, const std::string& path,
                            std::chrono::milliseconds timeout) {
  nlohmann::json out;
  std::string error;
  std::thread([&] {
    const std::string ns = "/var/run/netns/" + host_ns(0);
    const int fd = ::open(ns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      error = "cannot enter " + ns + ": " + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return;
    }
    ::close(fd);
    httplib::Client client(url);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    const auto res = client.Get(path);
    if (!res || res->status != 200) {
      error = "GET " + url + path + ": " +
              (res ? "status " + std::to_string(res->status) + " " + res->body
                   : httplib::to_string(res.error()));
      return;
    }
    out = nlohmann::json::parse(res->body, nullptr, false);
    if (out.is_discarded()) error = "GET " + url + path + ": not JSON: " + res->body;
  }).join();
  if (!error.empty()) throw std::runtime_error(error);
  return out;
}

// Bytes each worker of every engine has received so far (/debug/info), engine by engine.
std::vector<std::uint64_t> worker_bytes(const std::vector<std::string>& urls,
                                        std::chrono::milliseconds timeout) {
  std::vector<std::uint64_t> bytes;
  for (const std::string& url : urls) {
    const nlohmann::json info = get_in_host0(url, "/debug/info", timeout);
    for (const auto& w : info.at("workers"))
      bytes.push_back(w.at("bytes_received").get<std::uint64_t>());
  }
  return bytes;
}

// One weightcast-train run of o.shard_update_steps steps with `--shard mode`; every step must
// verify.
std::vector<TrainStep> run_trainer(const HostsBenchOptions& o, const std::string& self,
                                   const std::string& urls, const std::string& mode) {
  const std::chrono::milliseconds timeout(o.timeout_ms);
  std::vector<std::string> cmd =
      with_flags({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1",
                  beside_self(self, "train/weightcast-train"), "--verify"},
                 {{"--engines", urls},
                  {"--model", o.shard_update_model},
                  {"--steps", std::to_string(o.shard_update_steps)},
                  {"--bucket-bytes", std::to_string(o.shard_bucket_bytes)},
                  {"--delta", "off"},
                  {"--shard", mode},
                  {"--colocate", "off"},
                  {"--seed", "1"},
                  {"--bind-address", host_addr(0)},
                  {"--update-timeout-ms", std::to_string(o.timeout_ms)}});
  const std::vector<TrainStep> steps = run_train_in_host0(
      std::move(cmd), o.shard_update_steps, timeout, "weightcast-train --shard " + mode, {});
  for (const TrainStep& s : steps) {
    if (!s.verified) {
      throw std::runtime_error("weightcast-train --shard " + mode + ": step " +
                               std::to_string(s.step) + " did not verify");
    }
  }
  return steps;
}

}  // namespace

void measure_sharded_update(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                            double link) {
  const std::chrono::milliseconds timeout(o.timeout_ms);
  for (int tp : o.shard_update_tps) {
    std::vector<std::unique_ptr<ChildProcess>> engines;
    for (int e = 0; e < o.receivers / tp; ++e)
      engines.push_back(start_torch_engine(o, self, tp, e));
    std::vector<std::string> urls;
    for (auto& engine : engines) urls.push_back(torch_engine_url(*engine, timeout));
    std::string url_list;
    for (const std::string& url : urls) url_list += (url_list.empty() ? "" : ",") + url;
    struct Mean {
      double seconds = 0;
      std::uint64_t rank_bytes = 0;  // the most any worker received per step
    };
    std::map<std::string, Mean> mean;  // by --shard mode
    std::uint64_t model = 0;
    for (const std::string& mode : {std::string("off"), std::string("auto")}) {
      const std::vector<std::uint64_t> before = worker_bytes(urls, timeout);
      const std::vector<TrainStep> steps = run_trainer(o, self, url_list, mode);
      const std::vector<std::uint64_t> after = worker_bytes(urls, timeout);
      const std::string what = std::string(mode == "off" ? "upd full" : "upd sliced") + " tp" +
                               std::to_string(tp) + " s";
      double sum = 0;
      for (const TrainStep& s : steps) {  // every one verified (run_trainer): no wrong bytes
        const double gbps = static_cast<double>(s.bytes) / s.seconds / 1e9;
        table.add(
            {what + std::to_string(s.step), s.bytes, s.seconds * 1e6, gbps, gbps * 1e9 / link}, 0);
        if (s.step >= 2) sum += s.seconds;
        model = s.bytes;
      }
      std::uint64_t most = 0;
      for (std::size_t w = 0; w < after.size(); ++w) most = std::max(most, after[w] - before[w]);
      mean[mode] = {sum / (o.shard_update_steps - 1),
                    most / static_cast<std::uint64_t>(o.shard_update_steps)};
    }
    char buf[400];
    std::snprintf(buf, sizeof(buf),
                  "sharded update tp %d (%d engines, %s): sliced %.3f s per step, full %.3f s "
                  "(steps 2..%d): sliced %.2fx faster; a worker received at most %llu B per step "
                  "sliced (%.3f of the model), %llu B full (%.3f)",
                  tp, o.receivers / tp, o.shard_update_model.c_str(), mean["auto"].seconds,
                  mean["off"].seconds, o.shard_update_steps,
                  mean["off"].seconds / mean["auto"].seconds,
                  static_cast<unsigned long long>(mean["auto"].rank_bytes),
                  static_cast<double>(mean["auto"].rank_bytes) / static_cast<double>(model),
                  static_cast<unsigned long long>(mean["off"].rank_bytes),
                  static_cast<double>(mean["off"].rank_bytes) / static_cast<double>(model));
    table.note(buf);
  }
}

}  // namespace weightcast::launcher

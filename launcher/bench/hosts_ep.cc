#include "launcher/bench/hosts_ep.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "launcher/bench/engines.h"
#include "launcher/bench/hosts_net.h"
#include "launcher/bench/update.h"
#include "launcher/child_process.h"
#include "launcher/cli_util.h"

namespace weightcast::launcher {

std::optional<TrainStep> parse_train_step(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  TrainStep r;
  if (!(in >> word) || word != "step" || !(in >> word)) return std::nullopt;
  r.step = std::atoi(word.c_str());
  std::string prev;
  bool have_seconds = false;
  while (in >> word) {
    if (prev == "bytes" && r.bytes == 0) r.bytes = std::stoull(word);
    if (prev == "seconds") {
      r.seconds = std::stod(word);
      have_seconds = true;
    }
    if (prev == "verified") r.verified = word == "yes";
    if (word.rfind("gather=", 0) == 0) r.gather = std::stod(word.substr(7));
    prev = word;
  }
  if (!have_seconds) return std::nullopt;
  return r;
}

std::vector<TrainStep> run_train_in_host0(std::vector<std::string> cmd, int steps,
                                          std::chrono::milliseconds timeout,
                                          const std::string& what,
                                          const std::function<void(const std::string&)>& on_line) {
  ChildOptions co;
  co.own_group = true;  // mpirun's agents and daemons go with it
  // PMIx's shared-memory data store is one per machine, not per namespace: its hash store
  // instead (otherwise PMIx prints dstore errors when the daemons of two hosts meet there).
  co.extra_env = {"PMIX_MCA_gds=hash"};
  ChildProcess train(in_ns(host_ns(0), std::move(cmd)), co);
  std::vector<TrainStep> out;
  while (static_cast<int>(out.size()) < steps) {
    const auto line = train.read_line(timeout);
    if (!line) break;
    if (on_line) on_line(*line);
    if (auto r = parse_train_step(*line)) out.push_back(*r);
  }
  const int rc = train.wait_exit(timeout);
  if (rc != 0 || static_cast<int>(out.size()) != steps) {
    throw std::runtime_error(what + " exited " + std::to_string(rc) + " after " +
                             std::to_string(out.size()) + " of " + std::to_string(steps) +
                             " steps; its output:\n" + train.output());
  }
  return out;
}

namespace {

// mpirun's host list: this host (rank 0, the stage source, in host 0 with mpirun), then one
// slot in each other EP host, reached through the netns agent.
std::string hostfile_text(int ep) {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) throw std::runtime_error("gethostname failed");
  std::string text = std::string(name) + " slots=1\n";
  for (int k = 1; k < ep; ++k) text += host_ns(k) + " slots=1\n";
  return text;
}

struct TrainerRun {
  std::vector<TrainStep> steps;
  std::string gather;  // the mode the trainer ran ("stage gather MODE": auto resolved)
};

// One weightcast-train run of `steps` steps in gather mode `gather` against fresh engines.
TrainerRun run_trainer(const HostsBenchOptions& o, const std::string& self,
                       const std::string& gather) {
  const int ep = o.trainer_ep;
  const std::chrono::milliseconds timeout(o.timeout_ms);
  UpdateBenchOptions uo;
  uo.bucket_bytes = o.trainer_bucket_bytes;
  uo.timeout_ms = o.timeout_ms;
  std::vector<std::unique_ptr<ChildProcess>> engines;
  std::string urls;
  for (int j = 0; j < o.trainer_engines; ++j) {
    const int host = ep + j;
    engines.push_back(std::make_unique<ChildProcess>(
        in_ns(host_ns(host), update_engine_argv(uo, self, o.trainer_model, o.trainer_bucket_bytes,
                                                host_addr(host))),
        engine_child()));
    urls += (urls.empty() ? "" : ",") + engine_url(*engines.back(), timeout);
  }
  const TempFile hostfile("weightcast-bench-hostfile", hostfile_text(ep));
  // mpirun in host 0; MPI between the hosts over the shaped links (TCP on their subnet).
  std::vector<std::string> cmd = {"mpirun",          "--allow-run-as-root", "--oversubscribe",
                                  "--hostfile",      hostfile.path(),       "-np",
                                  std::to_string(ep)};
  const std::pair<std::string, std::string> mca[] = {{"plm_rsh_agent", self + " netns-agent"},
                                                     {"btl", "self,tcp"},
                                                     {"btl_tcp_if_include", hosts_subnet()},
                                                     {"oob_tcp_if_include", hosts_subnet()}};
  for (const auto& [name, value] : mca) cmd.insert(cmd.end(), {"--mca", name, value});
  cmd.insert(cmd.end(), {beside_self(self, "train/weightcast-train"), "--engines", urls, "--model",
                         o.trainer_model});
  cmd.insert(cmd.end(), {"--ep", std::to_string(ep), "--steps", std::to_string(o.trainer_steps)});
  cmd.insert(cmd.end(), {"--bucket-bytes", std::to_string(o.trainer_bucket_bytes), "--delta", "off",
                         "--tp-gather", gather, "--verify", "--seed", "1"});
  cmd.insert(cmd.end(),
             {"--bind-address", host_addr(0), "--update-timeout-ms", std::to_string(o.timeout_ms)});
  TrainerRun run;
  const std::string what =
      "weightcast-train (ep " + std::to_string(ep) + ", --tp-gather " + gather + ")";
  run.steps = run_train_in_host0(std::move(cmd), o.trainer_steps, timeout, what,
                                 [&run](const std::string& line) {
                                   if (line.rfind("stage gather ", 0) == 0) {
                                     std::istringstream words(line.substr(13));
                                     words >> run.gather;
                                   }
                                 });
  return run;
}

}  // namespace

int trainer_ep_hosts(const HostsBenchOptions& o) {
  return o.trainer_ep > 0 ? o.trainer_ep + o.trainer_engines : 0;
}

void measure_trainer_ep(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                        double link) {
  std::map<std::string, double> means;  // gather mode, mean step seconds
  for (const std::string& gather : o.trainer_gathers) {
    const TrainerRun run = run_trainer(o, self, gather);
    const auto& steps = run.steps;
    double sum = 0, gather_sum = 0;
    int counted = 0;
    for (const auto& s : steps) {
      // What the step costs: the gather before the update (whole) plus the update.
      const double seconds = s.seconds + (run.gather == "whole" ? s.gather : 0);
      const double gbps = static_cast<double>(s.bytes) / seconds / 1e9;
      table.add(
          {"ep" + std::to_string(o.trainer_ep) + " " + gather + " step " + std::to_string(s.step),
           s.bytes, seconds * 1e6, gbps, gbps * 1e9 / link},
          s.verified ? 0 : 1);
      if (!s.verified) {
        throw std::runtime_error("weightcast-train step " + std::to_string(s.step) +
                                 " did not verify (--tp-gather " + gather + ")");
      }
      if (s.step >= 2) {
        sum += seconds;
        gather_sum += s.gather;
        ++counted;
      }
    }
    char buf[240];
    std::snprintf(buf, sizeof(buf),
                  "trainer ep %d --tp-gather %s (ran %s): %.3f s per step (mean of steps 2..%d), "
                  "gather %.3f s",
                  o.trainer_ep, gather.c_str(), run.gather.c_str(), sum / counted, o.trainer_steps,
                  gather_sum / counted);
    table.note(buf);
    means[gather] = sum / counted;
  }
  if (means.count("whole") && means.count("overlap")) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "trainer ep %d: overlap %.2fx the speed of whole", o.trainer_ep,
                  means["whole"] / means["overlap"]);
    table.note(buf);
  }
}

int run_netns_agent(const std::vector<std::string>& args) {
  std::size_t i = 0;
  while (i < args.size() && !args[i].empty() && args[i][0] == '-') ++i;  // ssh-style options
  if (i + 1 >= args.size()) {
    std::fprintf(stderr, "weightcast-bench netns-agent: usage: netns-agent HOST COMMAND...\n");
    return 2;
  }
  const std::string& host = args[i];
  if (host.rfind("wcbench-h", 0) != 0) {
    std::fprintf(stderr, "weightcast-bench netns-agent: %s is not a hosts-mode namespace\n",
                 host.c_str());
    return 2;
  }
  std::string command;
  for (std::size_t k = i + 1; k < args.size(); ++k) command += (k > i + 1 ? " " : "") + args[k];
  const char* argv[] = {"ip",      "netns", "exec",          host.c_str(),
                        "/bin/sh", "-c",    command.c_str(), nullptr};
  execvp("ip", const_cast<char* const*>(argv));
  std::fprintf(stderr, "weightcast-bench netns-agent: cannot run ip: %s\n", std::strerror(errno));
  return 127;
}

}  // namespace weightcast::launcher

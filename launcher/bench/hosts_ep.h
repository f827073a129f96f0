// weightcast-bench hosts --trainer-ep N: weightcast-train's expert-parallel stage between the
// hosts. EP rank k runs in host k (rank 0, the stage source, in host 0) and one engine in each of
// the next --trainer-engines hosts, every link shaped as for the broadcast. Each --tp-gather mode
// (whole: the expert shards gathered to the source before the update opens; overlap: gathered in
// groups of about a bucket while the source broadcasts the groups it has) runs the same steps
// against fresh engines, and the rows give what a step costs the user: gather plus update for
// whole, the update (its gather inside) for overlap.
//
// mpirun runs in host 0 and reaches the other hosts as it would remote nodes: its rsh agent is
// `weightcast-bench netns-agent`, which runs the daemon's command inside the host's namespace.
// So MPI's gather crosses the shaped links (btl tcp on the hosts' subnet) instead of shared
// memory, and every MPI process talks to a daemon in its own namespace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/bench/hosts.h"
#include "launcher/bench/table.h"

namespace weightcast::launcher {

// What a weightcast-train step line says that the hosts rows need.
struct TrainStep {
  int step = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;  // the update (with overlap, the gather inside it)
  double gather = 0;   // the stage's gather (phases gather=)
  bool verified = false;
};
// The step line's fields ("step N/M ... bytes B ... seconds S ... verified yes wire W ...
// gather=G"), or nullopt for any other line.
std::optional<TrainStep> parse_train_step(const std::string& line);

// Runs `cmd` (weightcast-train under mpirun) inside host 0 to its end and returns its first
// `steps` step lines; `on_line` (may be empty) sees every line read. Throws std::runtime_error
// naming `what`, with its output, unless it printed `steps` step lines and exited 0, each line
// and the exit within `timeout`.
std::vector<TrainStep> run_train_in_host0(std::vector<std::string> cmd, int steps,
                                          std::chrono::milliseconds timeout,
                                          const std::string& what,
                                          const std::function<void(const std::string&)>& on_line);

// Hosts the trainer measurement uses (EP ranks and engines); 0 when off.
int trainer_ep_hosts(const HostsBenchOptions& o);

// Adds the rows of every gather mode and the overlap-vs-whole note. Throws std::runtime_error
// when a trainer run fails or a step does not verify.
void measure_trainer_ep(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                        double link_bytes_per_s);

// The rsh agent mpirun calls as `AGENT [options] HOST COMMAND...`: runs COMMAND with /bin/sh
// inside HOST's namespace (HOST must be a hosts-mode namespace). Returns only on failure.
int run_netns_agent(const std::vector<std::string>& args);

}  // namespace weightcast::launcher

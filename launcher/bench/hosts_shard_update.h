// weightcast-bench hosts --shard-update-tps: the whole update, sliced against full, with every
// engine rank behind its own shaped link (docs/sharding.md). Where --shard-tps times the data
// plane alone, this times what a user waits for: weightcast-train's HTTP control plane, the
// broadcast, every rank's staging, digests and load, and --verify's check of every rank.
//
// For each TP size n, the engines are torch reference engines of n ranks (`python -m
// weightcast.reference --shard-plan recorded`): each engine's front (its HTTP routes) runs in host
// 0 beside the trainer, and its worker k, which joins the groups and keeps its slices, runs in
// host 1 + e*n + k (--worker-netns), so every byte a rank receives crosses that rank's link.
// weightcast-train (one stage source, mpirun -np 1 in host 0) runs the same steps twice against
// the same engines: --shard auto (each rank gets its slices, one chain per shard class) and
// --shard off (every rank gets every tensor whole, one chain), --verify on both. Rows time each
// step's update; notes give the mean of steps 2.. and the ratio.
//
// Needs an interpreter that imports torch and the weightcast package (--python; PYTHONPATH from
// the environment, else the build tree's python folder beside this program).
#pragma once

#include <string>

#include "launcher/bench/hosts.h"
#include "launcher/bench/table.h"

namespace weightcast::launcher {

// Adds the rows and notes of every TP size in o.shard_update_tps. Throws std::runtime_error when
// an engine does not start, a trainer run fails, or a step does not verify.
void measure_sharded_update(const HostsBenchOptions& o, const std::string& self, BenchTable& table,
                            double link_bytes_per_s);

}  // namespace weightcast::launcher

// weightcast-bench hosts --shard-tps: shard-aware broadcast against full broadcast between the
// hosts mode's network namespaces (docs/sharding.md). Every engine rank is a host of its own
// (its own shaped link, as a GPU with its own NIC), host 0 the trainer's source.
//
// For each TP size n, the receiving hosts are engines of n ranks (rank k of engine e in host
// 1 + e*n + k), each rank keeping its slices by the hand-written plan of a model of the bench's
// size (sync/model/tensor_parallel_plan.h). The source splits the ranks into shard classes
// (sync/trainer/shard_classes.h), writes each class's slices through SliceSource straight from
// the full tensors into its buckets and broadcasts them on the class's own chain, all classes at
// once. The full broadcast it is measured against sends every tensor whole to every rank on one
// chain, in the same buckets: that group does not depend on n. Every receiver checks the bytes
// it got in the warm-up pass.
//
// What it leaves out: the engines' HTTP control plane and staging (the hosts mode's update rows
// time those on the same links), and the trainer's gather.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store.h"
#include "launcher/bench/hosts.h"
#include "launcher/bench/table.h"
#include "launcher/child_process.h"

namespace weightcast::launcher {

// A communicator of `size` hosts-mode workers over `store`, this worker being `rank`, with the
// worker's chain options and address.
std::unique_ptr<comm::GlooCommunicator> hosts_communicator(const HostsWorkerOptions& o,
                                                           std::shared_ptr<comm::Store> store,
                                                           int rank, int size);

// The worker's part: the full broadcast, then each of o.shard_tps. Rank 0 prints
// "shard full US WRONG BYTES_PER_RANK" and, per TP size, "shard N US WRONG MAX_BYTES_PER_RANK
// PLANNED_MAX_BYTES_PER_RANK FORMULA_BYTES CLASSES": what a rank received at most, what the
// plans give a rank at most, and the sharded bytes over N plus the replicated ones.
void time_sharded(const HostsWorkerOptions& o, comm::GlooCommunicator& world,
                  std::shared_ptr<comm::Store> store);

// The bench's part: reads those lines from host 0's worker and adds a row per broadcast and a
// note per TP size to `table` (`link`: a rank link's rate in bytes/s).
void add_sharded_rows(const HostsBenchOptions& o, ChildProcess& root, BenchTable& table,
                      double link);

}  // namespace weightcast::launcher

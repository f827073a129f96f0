// The broadcast table's closing notes, from its rows (rank 0): nccl-tests' average bus bandwidth
// per backend and #wrong, then gloo-chain's ratio against every other backend measured in the
// same run — at the largest size, below 16 MiB (worst and geometric mean) and from 4 MiB.
// Threading: the caller's thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/bench/table.h"

namespace weightcast::launcher {

// `backends`: the names in the table, in the order of the average line.
void summarize_broadcast(BenchTable& table, const std::vector<std::string>& backends,
                         std::uint64_t wrong);

}  // namespace weightcast::launcher

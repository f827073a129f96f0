// The hosts mode's network: host i is network namespace host_ns(i) with address host_addr(i) on
// a bridge, every host's link shaped (launcher/bench/hosts.cc builds and removes them).
#pragma once

#include <string>
#include <vector>

namespace weightcast::launcher {

// "wcbench-h<i>": the namespace of host i.
std::string host_ns(int i);
// Host i's address (198.18.0.<i+1>, the range reserved for network benchmarks).
std::string host_addr(int i);
// The subnet every host address is in ("198.18.0.0/24").
std::string hosts_subnet();
// `argv` run inside namespace `ns` (through `ip netns exec`).
std::vector<std::string> in_ns(const std::string& ns, std::vector<std::string> argv);

}  // namespace weightcast::launcher

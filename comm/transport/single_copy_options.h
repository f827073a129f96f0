// Same-host single copy's options (comm/transport/single_copy.h).
#pragma once

#include <cstddef>

namespace weightcast::comm {

// With the eager ring on: when every member runs on one host (same boot, network and PID
// namespace, user), receivers copy broadcasts of at least min_bytes, of any size, straight out of
// a ring neighbour's memory with process_vm_readv instead of through sockets or Gloo. The group
// agrees: one member with enabled false, or one the kernel will not let the others read, keeps the
// whole group on sockets and Gloo. Smaller broadcasts stay on the ring's sockets, which have the
// lower latency below it. Every member must use the same min_bytes. The default is the measured
// crossover (docs/performance.md, "Same-host single copy as a pipelined chain"): at 64 KiB the two
// paths are even, from 128 KiB single copy won every run by 1.8x or more.
struct SingleCopyOptions {
  bool enabled = true;
  std::size_t min_bytes = 128u << 10;
  // Declare every process of this user a permitted reader of this one's memory
  // (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)) before the group probes, so single copy works
  // under Yama ptrace_scope 1 without lowering it system-wide. Every member of the group must set
  // it (each reads the others' tokens; receivers read the root's buffers). What it exposes:
  // docs/security.md, "Same-host single copy".
  bool allow_same_user_reads = false;
};

}  // namespace weightcast::comm

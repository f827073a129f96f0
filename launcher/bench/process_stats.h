// What a process has used so far, for the benches' notes: its peak resident set and its CPU
// time, read from /proc (any process) or getrusage (this one). Every reader returns 0 when the
// value cannot be read. Threading: plain functions, safe from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace weightcast::launcher {

// Peak resident set of a process in bytes (VmHWM).
std::uint64_t peak_rss(pid_t pid);

// CPU seconds (user + system) a process has used so far.
double cpu_seconds(pid_t pid);

// Peak resident set of this process in bytes.
std::uint64_t self_peak_rss();

}  // namespace weightcast::launcher

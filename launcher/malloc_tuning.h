// The C library's allocator, set up for a process that runs the same update again and again
// (weightcast-engine, weightcast-train, weightcast-bench; a library never changes it for its host
// process).
//
// Why: an update allocates and frees small objects per tensor (staged entries, names, digests,
// request JSON) on whichever thread serves it. With glibc's defaults each thread may get an arena
// of its own, and freed memory goes back to the kernel, so an update often lands on fresh pages
// and takes a page fault per 4 KiB. Measured on a 2-core virtual machine, moe-1g (1,794 tensors):
// the engine's commit took 301 faults and 7-13 ms, 2.5 ms without the faults
// (docs/performance.md, "Per-tensor costs"). So: one arena, and freed memory and buffers up to
// 4 MiB kept in the heap for the next update. Where the engine runs inside another program
// (the Python Receiver in vLLM or SGLang), MALLOC_ARENA_MAX=1 in its environment does the same.
#pragma once

namespace weightcast::launcher {

// Call first thing in main(), before any thread starts. Returns false if the C library refused
// (the defaults then stay; nothing else changes).
bool tune_malloc_for_updates();

}  // namespace weightcast::launcher

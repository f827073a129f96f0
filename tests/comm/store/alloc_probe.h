// Allocation probe: the test binary that links alloc_probe.cc replaces global operator new and
// records the largest single allocation, so a test can prove that a frame claiming a huge length
// was refused without the server allocating anything of that size.
// Lifetime: process-wide. Threading: the record is an atomic maximum, safe from any thread.
#pragma once

#include <cstddef>

namespace weightcast::testing {

void reset_largest_allocation();
std::size_t largest_allocation();

// Resident set size of this process in bytes, from /proc/self/status (0 where unavailable).
std::size_t resident_bytes();

}  // namespace weightcast::testing

// Shared by the MPI test binary's main() and its tests: the world size the tests are written
// for and the process's MpiGuard. Lifetime: the guard lives for the whole of main().
#pragma once

#include "comm/mpi/mpi_helpers.h"

namespace weightcast::comm::mpi::testing {

inline constexpr int kWorldSize = 4;

const MpiGuard& guard();

}  // namespace weightcast::comm::mpi::testing

// Lets a launcher that needs MPI ranks start itself under mpirun when a user ran it directly
// ("weightcast-bench broadcast --ranks 3" re-executes as "mpirun -np 3 weightcast-bench ...").
#pragma once

#include <string>
#include <vector>

namespace weightcast::launcher {

// True when this process was started by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE).
bool under_mpirun();

// Replaces this process with `mpirun <flags> -np N <argv...>`; returns only by throwing
// std::runtime_error when mpirun cannot be executed. Extra mpirun flags come from the
// WEIGHTCAST_MPIRUN_FLAGS environment variable, else from the flags this build was configured
// with (loopback-only TCP, oversubscribe, root allowed).
// `mca` entries ("btl=self,tcp") replace the value of that MCA parameter in those flags (or are
// added), so a benchmark can pin MPI to its TCP transport.
// The command line relaunch_under_mpirun() runs, for a caller that starts it as a child.
std::vector<std::string> mpirun_argv(int np, const std::vector<std::string>& argv,
                                     const std::vector<std::string>& mca = {});

[[noreturn]] void relaunch_under_mpirun(int np, const std::vector<std::string>& argv,
                                        const std::vector<std::string>& mca = {});

}  // namespace weightcast::launcher

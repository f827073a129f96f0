#!/usr/bin/env bash
# Prints the mpirun arguments weightcast uses on one host with loopback networking only, as
# root and oversubscribed (the reasons are in comm/mpi/CMakeLists.txt, WEIGHTCAST_MPIRUN_FLAGS;
# keep both lists equal, a ctest compares them). Usage:
#   mpirun $(scripts/mpirun-flags.sh) -np 4 ./build/tests/comm/mpi/weightcast_mpi_test
echo "--allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader,tcp" \
  "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"

#!/usr/bin/env bash
# Runs the whole test suite of an existing ./build with ctest (every test has its own timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Many tests run a trainer that must fail; when a rank exits non-zero, mpirun's default gives the
# job's processes a second after SIGTERM before SIGKILL, twice: 2 s per failing run. Without that
# grace a failed run ends at once, with the same exit status.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
# The libFuzzer targets' clang sub-build (fuzz_libfuzzer_smoke runs them) is built first, so the
# test run only runs them; 77: no clang fuzzer runtime here (the test then skips, saying so).
sub=$(realpath -m "$build_dir/fuzz-clang")
WEIGHTCAST_FUZZ_JOBS=${JOBS:-2} bash fuzz/run_libfuzzer.sh "$PWD" "$sub" build-only || [ $? -eq 77 ]
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" "$@"

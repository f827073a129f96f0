#!/usr/bin/env bash
# Runs the whole test suite of an existing ./build with ctest (every test has its own timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The libFuzzer targets' clang sub-build (fuzz_libfuzzer_smoke runs them) is built first, so the
# test run only runs them; 77: no clang fuzzer runtime here (the test then skips, saying so).
sub=$(realpath -m "$build_dir/fuzz-clang")
WEIGHTCAST_FUZZ_JOBS=${JOBS:-2} bash fuzz/run_libfuzzer.sh "$PWD" "$sub" build-only || [ $? -eq 77 ]
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" "$@"

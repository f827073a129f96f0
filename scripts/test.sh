#!/usr/bin/env bash
# Runs the whole test suite of an existing ./build with ctest (every test has its own timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" "$@"

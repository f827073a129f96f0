#!/usr/bin/env bash
# Configures and builds weightcast into ./build (override with BUILD_DIR). Extra arguments go to
# CMake's configure step, e.g. scripts/build.sh -DWEIGHTCAST_WITH_NCCL=ON
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -DWEIGHTCAST_WERROR=ON "$@"
cmake --build "$build_dir" -j "$jobs"

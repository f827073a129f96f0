#!/usr/bin/env bash
# The main job. For now: a short broadcast benchmark between local processes over loopback,
# our pipelined Gloo chain against stock gloo::broadcast and MPI_Bcast in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$build_dir/launcher/weightcast-bench" broadcast --ranks 3 --min-bytes 1M --max-bytes 64M \
  --factor 4 --warmup 1 --iters 3

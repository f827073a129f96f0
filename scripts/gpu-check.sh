#!/usr/bin/env bash
# GPU check: on a machine with CUDA GPUs, build weightcast with the NCCL backend and run what the
# CPU-only CI cannot. Usage: scripts/gpu-check.sh   (BUILD_DIR defaults to build-gpu, JOBS to nproc)
#
# Steps, each under its own timeout, stopping at the first failure with its exit status:
#   1. scripts/setup.sh               Debian packages (prints the apt-get command when not root)
#   2. configure                      -DWEIGHTCAST_WITH_NCCL=ON: fails loudly without CUDA/NCCL
#   3. build                          everything, warnings as errors
#   4. nvidia-smi -L                  the GPUs the tests will see
#   5. ctest -R Nccl                  NCCL unit, device and conformance tests, and the colocated
#                                     path's CUDA IPC (NcclColocateCudaIpc: a device segment
#                                     written and exported by one process, read by another;
#                                     NcclColocateCudaE2E: weightcast-train --colocate-memory cuda
#                                     updating two weightcast-engines, verified), one at a time
#                                     (device tests take every GPU; with
#                                     WEIGHTCAST_REQUIRE_CUDA_DEVICES=<GPUs> a device test that
#                                     would skip fails instead)
#   6. weightcast-bench broadcast     nccl (CUDA memory) vs gloo-chain (host) over all GPUs, if built
#   7. engine plug-ins                tests/python/plugin_check.py loads weightcast.vllm (backend,
#                                     its init_info/update_info parsers, worker extension) and
#                                     weightcast.sglang (worker hooks, server-info announce hook)
#                                     into the real vLLM / SGLang wherever they import; fails when
#                                     neither does (this is the GPU machine), and when an engine
#                                     named in WEIGHTCAST_REQUIRE_ENGINES (e.g. vllm,sglang) does
#                                     not import; then the shared vLLM dialect readers
#                                     (tests/python/test_vllm_dialect.py)
# Everything is printed; a device test that skips prints its reason in the ctest output.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2
  shift 2
  echo "=== gpu-check: ${name} (timeout ${limit}s): $*"
  local rc=0
  timeout --kill-after=15 "${limit}" "$@" || rc=$?
  if [ "${rc}" -ne 0 ]; then
    [ "${rc}" -eq 124 ] && echo "=== gpu-check: ${name} ran past ${limit}s"
    echo "=== gpu-check: FAILED at '${name}' (exit ${rc})"
    exit "${rc}"
  fi
}

step 900 setup bash scripts/setup.sh
step 300 configure cmake -S . -B "${build_dir}" -DWEIGHTCAST_WERROR=ON -DWEIGHTCAST_WITH_NCCL=ON
step 1800 build cmake --build "${build_dir}" -j "${jobs}"
step 60 "list GPUs" nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
ranks=$((gpus > 0 ? gpus : 1))
# Every GPU nvidia-smi lists must be usable: a device test that needs at most that many devices
# fails instead of skipping (a broken CUDA runtime is not "no GPU").
export WEIGHTCAST_REQUIRE_CUDA_DEVICES="${gpus}"
step 900 "NCCL tests" ctest --test-dir "${build_dir}" -R Nccl --output-on-failure -j 1

bench="${build_dir}/launcher/weightcast-bench"
if [ -x "${bench}" ]; then
  step 900 "broadcast bench" "${bench}" broadcast --backends nccl,gloo-chain \
    --ranks "${ranks}" --min-bytes 1M --max-bytes 1G --iters 5
else
  echo "=== gpu-check: broadcast bench skipped (${bench} was not built)"
fi
if [ -d "${build_dir}/python/weightcast" ]; then
  step 600 "engine plug-ins" env PYTHONPATH="${build_dir}/python" python3 tests/python/plugin_check.py
  step 120 "vLLM dialect readers" env PYTHONPATH="${build_dir}/python" \
    python3 tests/python/test_vllm_dialect.py
else
  echo "=== gpu-check: engine plug-ins: FAILED (the Python module was not built)"
  exit 1
fi
echo "=== gpu-check: all steps passed (${gpus} GPU(s))"

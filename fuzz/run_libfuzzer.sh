#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in a sub-build and runs each for a fixed number of
# inputs over the committed seed corpus. ctest runs it with a small RUNS (a smoke test); run it by
# hand with a larger one, or call the fuzzers directly (docs/security.md, "Fuzzing").
#
#   fuzz/run_libfuzzer.sh SOURCE_DIR SUB_BUILD_DIR RUNS
#   fuzz/run_libfuzzer.sh SOURCE_DIR SUB_BUILD_DIR build-only   (builds, runs nothing: test.sh)
#
# Exit 0: every target ran RUNS inputs without a crash. Exit 77 (ctest SKIP_RETURN_CODE): clang++
# or its libFuzzer/sanitizer runtime is missing here. Anything else: a failure (build or crash;
# the crashing input is left in SUB_BUILD_DIR/fuzz-work/<target>/).
set -euo pipefail

src=${1:?source dir}
sub=${2:?sub-build dir}
runs=${3:?runs}
cxx=${WEIGHTCAST_FUZZ_CXX:-clang++}
cc=${WEIGHTCAST_FUZZ_CC:-clang}

if ! command -v "$cxx" >/dev/null 2>&1 || ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP: $cxx / $cc not found; the g++ replay tests still exercise the fuzz targets"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }' \
  >"$probe/probe.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cc" -o "$probe/probe" \
  >"$probe/log" 2>&1; then
  echo "SKIP: $cxx cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing):"
  head -5 "$probe/log"
  exit 77
fi

if [ ! -f "$sub/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$sub" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_C_COMPILER="$cc" -DWEIGHTCAST_FUZZ=ON -DWEIGHTCAST_BUILD_TESTS=OFF \
    -DWEIGHTCAST_WITH_NCCL=OFF -DWEIGHTCAST_WERROR=ON >"$sub.configure.log" 2>&1 ||
    { cat "$sub.configure.log"; exit 1; }
fi
cmake --build "$sub" --target weightcast_fuzz_protocol weightcast_fuzz_store_protocol \
  -j"${WEIGHTCAST_FUZZ_JOBS:-2}"
if [ "$runs" = build-only ]; then
  exit 0
fi

status=0
for target in protocol store_protocol; do
  work="$sub/fuzz-work/$target"
  rm -rf "$work"
  mkdir -p "$work/new"
  # New inputs go to the scratch folder first on the command line; the committed corpus is only
  # read. Crash, leak and timeout files land in $work.
  echo "== weightcast_fuzz_$target: $runs runs"
  if ! (cd "$work" && "$sub/fuzz/weightcast_fuzz_$target" -runs="$runs" -seed=1 \
    -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$src/fuzz/$target.dict" new "$src/fuzz/corpus/$target" >"$work/log" 2>&1); then
    status=1
    tail -40 "$work/log"
    echo "FAILED: weightcast_fuzz_$target; inputs left in $work"
  else
    grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|cov:' \
      "$work/log" | tail -5
  fi
done
exit $status

#!/usr/bin/env bash
# Broadcast bandwidth of groups with torch members, next to weightcast-only groups, in one run.
# Usage: scripts/bench-torch-group.sh [BYTES] [ITERS]   (defaults 64 MiB, 10; needs ./build)
#
# Four members on this machine (loopback), rank 0 the source, BYTES per broadcast, ITERS timed
# broadcasts after one warm-up. Rows (nccl-tests style; busbw = algbw for broadcast):
#   chain        4 weightcast members, our pipelined chain (the default for weightcast groups)
#   wc-tree      4 weightcast members, torch-compatible mode (gloo::broadcast, torch's tags)
#   mixed        weightcast source + 1 torch + 2 weightcast receivers (issue 9's mixed group)
#   torch        4 torch members (ProcessGroupGloo alone, the peer a user would otherwise run)
# time_us is the median over ITERS of the slowest member's broadcast time; #wrong counts members
# whose XXH3-128 digest differs from the source's.
set -euo pipefail
cd "$(dirname "$0")/.."
bytes=${1:-67108864}
iters=${2:-10}
build_dir=${BUILD_DIR:-build}
tool="${build_dir}/tests/interop/torch_group_member"
script=tests/interop/torch_group_member.py
python=$(grep -s '^WEIGHTCAST_TORCH_PYTHON:' "${build_dir}/CMakeCache.txt" | cut -d= -f2- || true)
[ -x "${tool}" ] || { echo "bench-torch-group: build first (${tool} missing)" >&2; exit 1; }
[ -n "${python}" ] || { echo "bench-torch-group: no Python with torch was found at configure" >&2; exit 1; }
spec="uint8:${bytes}"
for _ in $(seq 1 "${iters}"); do spec="${spec},uint8:${bytes}"; done
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "${work}"; }
trap cleanup EXIT

member() {  # member SIDE RANK [extra args...] > log
  local side=$1 rank=$2
  shift 2
  if [ "${side}" = torch ]; then
    GLOO_SOCKET_IFNAME=lo "${python}" "${script}" --rank "${rank}" --world 4 --spec "${spec}" "$@"
  else
    "${tool}" --rank "${rank}" --world 4 --spec "${spec}" "$@"
  fi
}

run_group() {  # run_group NAME SIDE0 SIDE1 SIDE2 SIDE3 [--chain]
  local name=$1 extra=${6:-}
  local sides=("$2" "$3" "$4" "$5")
  pids=()
  member "${sides[0]}" 0 --host-store ${extra} > "${work}/${name}.0" 2>&1 &
  pids+=($!)
  local port=""
  for _ in $(seq 1 600); do
    port=$(awk '/^port /{print $2}' "${work}/${name}.0")
    [ -n "${port}" ] && break
    sleep 0.1
  done
  [ -n "${port}" ] || { echo "bench-torch-group: ${name}: no store port" >&2; cat "${work}/${name}.0" >&2; exit 1; }
  for r in 1 2 3; do
    member "${sides[$r]}" "${r}" --store-port "${port}" ${extra} > "${work}/${name}.${r}" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "bench-torch-group: ${name}: a member failed" >&2; tail -3 "${work}/${name}".* >&2; exit 1; }; done
  awk -v name="${name}" -v bytes="${bytes}" '
    /^digest / { i = $2; if (i == 0) next; t[i] = (t[i] > $5 ? t[i] : $5);
                 if (FILENAME ~ /\.0$/) ref[i] = $3; else got[FILENAME, i] = $3; n = (i > n ? i : n) }
    END {
      wrong = 0
      for (k in got) { split(k, parts, SUBSEP); if (got[k] != ref[parts[2]]) wrong++ }
      m = 0; for (i = 1; i <= n; i++) v[++m] = t[i]
      for (i = 2; i <= m; i++) { x = v[i]; j = i - 1; while (j > 0 && v[j] > x) { v[j + 1] = v[j]; j-- } v[j + 1] = x }
      med = (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
      printf "%-8s %12d %12.0f %10.3f %10.3f %7d\n", name, bytes, med * 1e6, bytes / med / 1e9, bytes / med / 1e9, wrong
    }' "${work}/${name}".0 "${work}/${name}".1 "${work}/${name}".2 "${work}/${name}".3
}

printf "# %d iterations after 1 warm-up, 4 members on loopback\n" "${iters}"
printf "%-8s %12s %12s %10s %10s %7s\n" "group" "size" "time_us" "algbw" "busbw" "#wrong"
run_group chain wc wc wc wc --chain
run_group wc-tree wc wc wc wc
run_group mixed wc torch wc wc
run_group torch torch torch torch torch

#!/usr/bin/env bash
# Mixture-of-experts updates against a dense model of the same bytes: weightcast-train under
# mpirun (tp 1, pp 1) feeds two engines; the dense twin (dense-1g: moe-1g's layers with one MLP as
# wide as all 64 experts together, the same bytes within 0.1%) with one rank, then the MoE model
# (moe-1g) at EP 1, 2 and 4 (mpirun -np 1, 2, 4: the EP ranks' expert shards reach the stage
# source through its gather, in each --tp-gather mode listed: whole, what auto picks on one host,
# gathers before the update opens; overlap during it). Every run starts fresh engines. Prints one row per run: the
# mean and median GB/s and the mean seconds of its updates after the first, the mean gather
# seconds (the step line's gather phase), and the ratios of both GB/s to the dense row. Usage:
#   bash scripts/bench-moe.sh [--moe moe-1g] [--dense dense-1g] [--steps 4] [--bucket-bytes 256M]
#                             [--ep "1 2 4"] [--tp-gather "whole"] [--rounds 1]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
moe=moe-1g dense=dense-1g steps=4 bucket=256M eps="1 2 4" gathers=whole rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --moe) moe=$2; shift 2 ;;
    --dense) dense=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bucket-bytes) bucket=$2; shift 2 ;;
    --ep) eps=$2; shift 2 ;;
    --tp-gather) gathers=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench-moe: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
. scripts/lib/engines.sh

# One run: model, EP size, gather mode. Prints "model ep GB/s seconds gather" averaged over
# steps 2..N.
run() {
  local model=$1 ep=$2 gather=$3
  launch_engine bench-moe a 1200 --port 0 --model "$model" --seed 1 --session-timeout-ms 120000
  local a=$engine_url
  launch_engine bench-moe b 1200 --port 0 --model "$model" --seed 1 --session-timeout-ms 120000
  local b=$engine_url
  timeout 900 mpirun "${mpi_flags[@]}" -np "$ep" "$train" --ep "$ep" --engines "$a,$b" \
    --model "$model" --seed 1 --steps "$steps" --bucket-bytes "$bucket" --delta off \
    --tp-gather "$gather" --verify 2>"$work/train.err" >"$work/train.out" || {
    echo "bench-moe: $model ep $ep failed:" >&2
    cat "$work/train.out" "$work/train.err" >&2
    exit 1
  }
  stop_engines
  # Mean and median GB/s: one step the host slows down (a 0.5 s pack or wire that the step's other
  # phases do not explain, seen at every EP size) moves a mean of a few steps by a third.
  awk -v m="$model" -v e="$ep" '/^step [0-9]+\// { split($2, st, "/"); if (st[1] < 2) next;
      for (i = 1; i < NF; i++) {
        if ($i == "GB/s") { g += $(i + 1); v[n] = $(i + 1) + 0 } if ($i == "seconds") s += $(i + 1)
        if ($i ~ /^gather=/) { split($i, kv, "="); w += kv[2] } }
      n++ }
    END { if (n == 0) exit 1
      for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      med = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
      printf "%s %s %.3f %.3f %.3f %.3f\n", m, e, g / n, med, s / n, w / n }' "$work/train.out"
}

echo "# tp 1 x pp 1, 2 engines x 1 rank, gloo on loopback, bucket $bucket, $steps steps per run" \
  "(mean and median of steps 2..$steps), --delta off, --verify; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %3s %-8s %8s %8s %9s %9s %9s %9s\n' model ep gather GB/s med_GB/s seconds gather_s \
  vs_dense med_vs_dense
first_gather=${gathers%% *}
for _ in $(seq 1 "$rounds"); do
  read -r _ _ dense_gbps dense_med dense_s dense_w < <(run "$dense" 1 "$first_gather")
  printf '%-10s %3s %-8s %8s %8s %9s %9s %9s %9s\n' "$dense" 1 - "$dense_gbps" "$dense_med" "$dense_s" \
    "$dense_w" 1.00 1.00
  for ep in $eps; do
    # EP 1 is a source alone in its stage: nothing to gather, one row.
    for gather in $([ "$ep" = 1 ] && echo "$first_gather" || echo "$gathers"); do
      read -r _ _ gbps med s w < <(run "$moe" "$ep" "$gather")
      printf '%-10s %3s %-8s %8s %8s %9s %9s %9.2f %9.2f\n' "$moe" "$ep" \
        "$([ "$ep" = 1 ] && echo - || echo "$gather")" "$gbps" "$med" "$s" "$w" \
        "$(awk -v a="$gbps" -v b="$dense_gbps" 'BEGIN { print a / b }')" \
        "$(awk -v a="$med" -v b="$dense_med" 'BEGIN { print a / b }')"
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# weightcast-train against `weightcast-bench update` for the same work: one trainer rank (tp 1,
# pp 1) under mpirun and the bench's updater each update one freshly started engine of 1 rank with
# the same model, bucket size and steps, --delta off. Prints both series of update seconds (the
# step line's `seconds`, the bench's per-step `seconds`), their medians over the steps after the
# first and the ratio, then the trainer's step lines' phases. Usage:
#   bash scripts/bench-train-vs-bench.sh [--model small] [--steps 8] [--bucket-bytes 512M]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
model=small steps=8 bucket=512M
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bucket-bytes) bucket=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench-train-vs-bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build_dir/launcher/weightcast-bench"
. scripts/lib/engines.sh

launch_engine bench-train-vs-bench train 600 --port 0 --ranks 1 --model "$model" --seed 1 \
  --session-timeout-ms 60000
timeout 600 mpirun "${mpi_flags[@]}" -np 1 "$train" --engines "$engine_url" --model "$model" \
  --seed 1 --steps "$steps" --bucket-bytes "$bucket" --delta off >"$work/train.out"
stop_engines
timeout 600 "$bench" update --models "$model" --engines 1 --delta off --bucket-bytes "$bucket" \
  --iters "$steps" --no-raw >"$work/bench.out"

train_s=$(awk '/^step [0-9]+\/[0-9]+ version/ { for (i = 1; i <= NF; i++) if ($i == "seconds") printf "%s ", $(i + 1) }' "$work/train.out")
bench_s=$(awk '$2 == "full" && $1 ~ /^[0-9]+$/ { printf "%s ", $3 }' "$work/bench.out")
median() { tr ' ' '\n' | sed 1d | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
tm=$(echo "$train_s" | median) bm=$(echo "$bench_s" | median)
echo "weightcast-train update seconds: $train_s(median after the first $tm)"
echo "bench update seconds:            $bench_s(median after the first $bm)"
# The trainer also pauses generation (pause_generation + flush_cache) and resumes it around each
# update, which the bench does not: the same ratio without those calls is the like-for-like one.
own_s=$(awk '/^step [0-9]+\/[0-9]+ version/ { s = 0; p = 0
    for (i = 1; i <= NF; i++) if ($i == "seconds") s = $(i + 1)
    for (i = 1; i <= NF; i++) if ($i ~ /^(pause|resume)=/) { split($i, kv, "="); p += kv[2] }
    printf "%.3f ", s - p }' "$work/train.out")
om=$(echo "$own_s" | median)
echo "train without pause/resume:      $own_s(median after the first $om)"
awk -v t="$tm" -v b="$bm" -v o="$om" \
  'BEGIN { printf "train / bench = %.2fx (without pause and resume %.2fx)\n", t / b, o / b }'
echo "trainer phases:"
grep -o 'phases .*' "$work/train.out" | sed 's/^/  /'

#!/usr/bin/env bash
# The TP gather against the broadcast: weightcast-train under mpirun (tp 2, pp 1) feeds two
# engines, alternating --tp-gather whole (one gather of the stage before the first bucket) and
# overlap (groups of about a bucket, gathered while the earlier buckets are broadcast), each run
# against freshly started engines. Prints, per step, the update's seconds and the step's wall time
# (shard generation + gather + update): the gather shows in the second. Usage:
#   bash scripts/bench-tp-gather.sh [--model qwen3-0.6b] [--steps 5] [--rounds 2] [--bucket-bytes 128M]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
model=qwen3-0.6b steps=5 rounds=2 bucket=128M
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --bucket-bytes) bucket=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "bench-tp-gather: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
. scripts/lib/engines.sh

start_engine() {  # name
  launch_engine bench-tp-gather "$1" 600 --port 0 --model "$model" --seed 1 \
    --session-timeout-ms 60000
}

echo "# tp 2 x pp 1, 2 engines, model $model, bucket $bucket, $steps steps per run, --delta off"
printf '%8s %5s %10s %10s\n' mode step update_s step_s
for _ in $(seq 1 "$rounds"); do
  for mode in whole overlap; do
    start_engine a; a=$engine_url
    start_engine b; b=$engine_url
    last=$(date +%s.%N)
    timeout 600 mpirun "${mpi_flags[@]}" -np 2 "$train" --tp 2 --pp 1 --engines "$a,$b" \
      --model "$model" --seed 1 --steps "$steps" --bucket-bytes "$bucket" --delta off \
      --tp-gather "$mode" 2>"$work/train.err" |
      while IFS= read -r line; do
        now=$(date +%s.%N)
        case "$line" in
          step\ *) awk -v m="$mode" -v l="$line" -v d0="$last" -v d1="$now" 'BEGIN { d = d1 - d0;
                     n = split(l, f, " "); for (i = 1; i < n; i++) if (f[i] == "seconds") s = f[i + 1];
                     split(f[2], st, "/"); printf "%8s %5s %10s %10.3f\n", m, st[1], s, d }' ;;
        esac
        last=$now
      done
    stop_engines
  done
done

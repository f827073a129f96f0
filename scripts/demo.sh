#!/usr/bin/env bash
# The main job: the frozen-draft case end to end, on one machine, no GPU.
#
# Two weightcast-engine processes (1 and 2 ranks), each with a target runner and a frozen
# EAGLE-style draft runner, both with the non-idempotent `shuffle` layout; trainer ranks under
# mpirun (tp 2 x pp 2, times EP for a mixture of experts) run STEPS training steps with a weight
# update after each, --verify on.
#   fixed:  safe finalize, selector chosen by the decision function (-> target)
#   legacy: engines with --legacy-finalize, selector forced to `all` (the old behaviour)
#   colo-fix, colo-old: the same two over the colocated path (--colocate on: the buckets go
#           through shared memory on this host, docs/colocated.md) instead of the chain
# Prints one row per step and scenario, then the accept-length comparison. Exits 0 only when
# both fixed scenarios verified every step. Everything it starts is stopped on exit.
#
# Usage: scripts/demo.sh [--model small|tiny|qwen3-0.6b|moe-small|deepseek-tiny|config.json]
#                        [--steps N] [--bucket-bytes 16M] [--backend gloo] [--ep N]
# With an MoE preset (moe-*, deepseek-*) --ep defaults to 2: mpirun -np 8, tp 2 x ep 2 x pp 2.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
model=small steps=5 bucket=16M backend=gloo ep=
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bucket-bytes) bucket=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --ep) ep=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "demo: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

case "$model" in
  moe-*|deepseek-*) ep=${ep:-2} ;;
  *) ep=${ep:-1} ;;
esac
np=$((4 * ep))

engine="$build_dir/launcher/engine/weightcast-engine"
train="$build_dir/launcher/train/weightcast-train"
for b in "$engine" "$train"; do
  [ -x "$b" ] || { echo "demo: $b is missing; build first (scripts/build.sh)" >&2; exit 2; }
done
. scripts/lib/engines.sh

# Starts an engine and sets engine_url once it listens (bounded wait; scripts/lib/engines.sh).
start_engine() {  # name ranks extra-flags...
  local name=$1 ranks=$2; shift 2
  launch_engine demo "$name" 200 --port 0 --ranks "$ranks" --draft --target-layout shuffle \
    --draft-layout shuffle --model "$model" --seed 1 --session-timeout-ms 30000 "$@"
}

run_scenario() {  # name selector engine-flags...
  local name=$1 selector=$2; shift 2
  local a b
  start_engine "$name-a" 1 "$@"; a=$engine_url
  start_engine "$name-b" 2 "$@"; b=$engine_url
  set +e
  timeout 300 mpirun "${mpi_flags[@]}" -np "$np" "$train" --tp 2 --pp 2 --ep "$ep" --engines "$a,$b" \
    --model "$model" --seed 1 --steps "$steps" --bucket-bytes "$bucket" --backend "$backend" \
    --selector "$selector" --speculative-algorithm EAGLE --verify --keep-going \
    --probe-accept-length "${train_extra[@]}" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  set -e
  stop_engines
  echo "$rc" >"$work/$name.rc"
}

# The fixed scenario trains realistically (fp32 masters rounded to bf16: about 2% of the elements
# change per step) with delta updates on (`on`: loopback outruns the encoder, so the default
# `auto` would keep full buckets here) in the `sparse` codec: on one host every encode and decode
# takes a core from the data plane, and sparse decodes about 4x faster than the default xor_zstd,
# whose smaller payloads pay on slow links instead (docs/performance.md, "Delta updates"); the old
# behaviour re-sends every element in full, as it always did (a delta would be refused there: the
# engine checks the base it holds, and the double shuffle corrupts it).
train_extra=(--drift realistic --delta on --delta-codec sparse --colocate off)
run_scenario fixed auto
train_extra=(--delta off --colocate off)
run_scenario legacy all --legacy-finalize
# The same case on the colocated path: the selector scopes a colocated bucket as it does one on
# the chain, so the fix holds there too, and the old behaviour corrupts the draft there too.
train_extra=(--drift realistic --colocate on)
run_scenario colo-fix auto
train_extra=(--delta off --colocate on)
run_scenario colo-old all --legacy-finalize

model_line=$(grep -m1 -o 'model .*' "$work/fixed.out" || true)
echo "weightcast demo: frozen EAGLE draft under weight updates"
echo "  ${model_line:-model $model}; engines: 2 (1 and 2 ranks), target + frozen draft, layout shuffle"
echo "  trainer: mpirun -np $np, tp 2 x ep $ep x pp 2; backend $backend; bucket $bucket; $steps steps; --verify"
echo
printf '%-9s %4s %8s %12s %12s %6s %7s %8s %7s %8s %9s %14s %s\n' scenario step version bytes \
  wire changed buckets seconds GB/s target_ok draft_same accept_length path
for name in fixed legacy colo-fix colo-old; do
  awk -v scen="$name" '
    / initial weights/ { for (i = 1; i <= NF; i++) if ($i == "accept_length") acc = $(i + 1);
      printf "%-9s %4s %8s %12s %12s %6s %7s %8s %7s %8s %9s %14s %s\n", scen, 0, "-", "-", "-",
             "-", "-", "-", "-", "-", "-", acc, "-"; next }
    /^step [0-9]+\/[0-9]+ version/ {
      split($2, s, "/"); acc = "-"; ch = "-"
      for (i = 1; i <= NF; i++) {
        if ($i == "version") v = $(i + 1); if ($i == "bytes") by = $(i + 1)
        if ($i == "buckets") bu = $(i + 1); if ($i == "seconds") se = $(i + 1)
        if ($i == "GB/s") gb = $(i + 1); if ($i == "target_ok") t = $(i + 1)
        if ($i == "draft_ok") d = $(i + 1); if ($i == "accept_length") acc = $(i + 1)
        if ($i == "wire") w = $(i + 1); if ($i == "changed") ch = $(i + 1)
        if ($i == "path") p = $(i + 1)
      }
      printf "%-9s %4s %8s %12s %12s %6s %7s %8s %7s %8s %9s %14s %s\n", scen, s[1], v, by, w, ch, bu,
             se, gb, t, d, acc, p
    }' "$work/$name.out"
  if [ "$(cat "$work/$name.rc")" != 0 ]; then
    grep -h -m2 -E 'VERIFY FAILED|FAILED|error' "$work/$name.err" "$work/$name.out" 2>/dev/null |
      sed -e "s/^weightcast-train: //" -e "s/^/  $name: /" | cut -c1-160 || true
  fi
done

first() { awk '/ initial weights/ { for (i = 1; i <= NF; i++) if ($i == "accept_length") print $(i + 1) }' "$1" | head -1; }
last() { awk '/^step [0-9]+\/[0-9]+ version/ { for (i = 1; i <= NF; i++) if ($i == "accept_length") a = $(i + 1) } END { print a }' "$1"; }
fixed_rows=$(grep -c '^step [0-9]*/[0-9]* version.* verified yes' "$work/fixed.out" || true)
echo "  (the tiled shuffle has order 1806 (sync/model/layout.h): every extra application of the old finalize"
echo "   leaves the draft in a wrong layout, so every step of the old behaviour is corrupt)"
echo
echo "accept length (engines a,b): step 0 reference $(first "$work/fixed.out");" \
  "old behaviour after step $steps: $(last "$work/legacy.out");" \
  "fixed after step $steps: $(last "$work/fixed.out")"
# Bytes on the wire with delta updates on (the fixed scenario), steps after the first.
awk '/^step [0-9]+\/[0-9]+ version/ { n++; if (n == 1) next
      for (i = 1; i <= NF; i++) { if ($i == "bytes") b += $(i + 1); if ($i == "wire") w += $(i + 1) } }
     END { if (w > 0) printf "delta updates (fixed, steps 2..%d): %d bytes of weights, %d on the wire (%.1fx less)\n", n, b, w, b / w }' \
  "$work/fixed.out"
colo_rows=$(grep -c '^step [0-9]*/[0-9]* version.* verified yes.* path colocated' "$work/colo-fix.out" || true)
echo "colocated path (colo-fix): verified $colo_rows/$steps steps, every one through shared memory; old behaviour there: $(grep -c 'verified no' "$work/colo-old.out" || true)/$steps steps failed verification, accept length after step $steps: $(last "$work/colo-old.out") (fixed: $(last "$work/colo-fix.out"))"
status=0
for scen in fixed colo-fix; do
  rows=$fixed_rows
  [ "$scen" = colo-fix ] && rows=$colo_rows
  if [ "$(cat "$work/$scen.rc")" != 0 ] || [ "$rows" != "$steps" ]; then
    echo "$scen scenario FAILED (exit $(cat "$work/$scen.rc"), $rows/$steps steps verified):" >&2
    tail -5 "$work/$scen.err" "$work/$scen.out" >&2
    status=1
  fi
done
if [ "$status" = 0 ]; then
  echo "fixed scenario: verified $fixed_rows/$steps steps (selector $(grep -m1 -o 'selector [a-z]*' "$work/fixed.out" | cut -d' ' -f2)); old behaviour: $(grep -c 'verified no' "$work/legacy.out" || true)/$steps steps failed verification"
fi
exit "$status"

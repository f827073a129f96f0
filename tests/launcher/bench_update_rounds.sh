#!/bin/sh
# weightcast-bench update --models A,B --rounds 2 runs A then B, then B then A, exits 0 and gives
# each model's ratio per round and their median. Usage: bench_update_rounds.sh WEIGHTCAST_BENCH
set -eu
bench=$1
code=0
out=$("$bench" update --engines 1 --models tiny,moe-tiny --bucket-bytes 1M --iters 2 --rounds 2 \
  --no-raw 2>&1) || code=$?
if [ "$code" -ne 0 ]; then echo "$out"; echo "FAIL: the bench exited $code"; exit 1; fi
order=$(echo "$out" | sed -n 's/^# round \([0-9]\) of 2: \(.*\)$/\1 \2/p' | tr '\n' ',')
if [ "$order" != "1 tiny,1 moe-tiny,2 moe-tiny,2 tiny," ]; then
  echo "$out"; echo "FAIL: rounds ran in the order '$order'"; exit 1
fi
for model in tiny moe-tiny; do
  if ! echo "$out" | grep -Eq "^#   $model +.*tensors: .*x, .*x; median [0-9.]+x of tiny$"; then
    echo "$out"; echo "FAIL: no per-round ratios and median for $model"; exit 1
  fi
done
echo "ok: $order"

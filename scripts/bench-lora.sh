#!/usr/bin/env bash
# The adapter path against a full update of the same model, in one run (docs/lora.md): one
# weightcast-engine of 1 rank holding a qwen3-8b-shaped model (qwen3-8b's projections, vocabulary
# and dtype, --layers of its 36 decoder layers, so trainer and engine fit one machine's memory),
# updated by one trainer rank first with the full model each step, then with a LoRA adapter of
# --rank on all seven projections (q/k/v/o/gate/up/down) each step, then the same adapter steps as
# deltas (--delta on). Prints bytes on the wire and the median update seconds after the first step
# for each, and the ratios. Usage:
#   bash scripts/bench-lora.sh [--layers 4] [--rank 16] [--steps 5] [--colocate off]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
layers=4 rank=16 steps=5 colocate=off
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers=$2; shift 2 ;;
    --rank) rank=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --colocate) colocate=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench-lora: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
. scripts/lib/engines.sh

# qwen3-8b's shapes (sync/model/model.cc's preset) with fewer layers.
model="$work/qwen3-8b-shaped.json"
cat >"$model" <<JSON
{"vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": $layers,
 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
 "intermediate_size": 12288, "torch_dtype": "bfloat16", "tie_word_embeddings": false}
JSON
targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
launch_engine bench-lora lora 1200 --port 0 --ranks 1 --model "$model" --seed 1 \
  --session-timeout-ms 120000
common=(--engines "$engine_url" --model "$model" --seed 1 --steps "$steps"
  --colocate "$colocate" --bucket-bytes 512M)
timeout 900 mpirun "${mpi_flags[@]}" -np 1 "$train" "${common[@]}" --delta off >"$work/full.out"
timeout 900 mpirun "${mpi_flags[@]}" -np 1 "$train" "${common[@]}" --delta off --lora-rank "$rank" \
  --lora-targets "$targets" >"$work/lora.out"
# The same adapter steps as deltas against the adapter of the step before (from step 2 on).
timeout 900 mpirun "${mpi_flags[@]}" -np 1 "$train" "${common[@]}" --lora-rank "$rank" \
  --lora-targets "$targets" --lora-name delta --delta on >"$work/lora-delta.out"
stop_engines

# field <file> <name>: the value after <name> on every step line.
field() { awk -v f="$2" '/^step [0-9]+\/[0-9]+ / { for (i = 1; i <= NF; i++) if ($i == f) printf "%s ", $(i + 1) }' "$1"; }
median() { tr ' ' '\n' | sed 1d | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
full_s=$(field "$work/full.out" seconds) lora_s=$(field "$work/lora.out" seconds)
full_w=$(field "$work/full.out" wire | awk '{ print $1 }') lora_w=$(field "$work/lora.out" wire | awk '{ print $1 }')
delta_s=$(field "$work/lora-delta.out" seconds) delta_w=$(field "$work/lora-delta.out" wire | median)
fm=$(echo "$full_s" | median) lm=$(echo "$lora_s" | median) dm=$(echo "$delta_s" | median)
grep '^lora ' "$work/lora.out" || true
echo "model: qwen3-8b-shaped, $layers layers; adapter rank $rank on $targets; $steps steps; colocate $colocate"
printf '%-14s %16s %12s  %s\n' update wire_bytes median_s "seconds per step"
printf '%-14s %16s %12s  %s\n' full "$full_w" "$fm" "$full_s"
printf '%-14s %16s %12s  %s\n' "lora r$rank" "$lora_w" "$lm" "$lora_s"
printf '%-14s %16s %12s  %s\n' "lora r$rank delta" "$delta_w" "$dm" "$delta_s"
awk -v fw="$full_w" -v lw="$lora_w" -v fs="$fm" -v ls="$lm" \
  'BEGIN { printf "full / lora: %.0fx the bytes on the wire, %.1fx the seconds\n", fw / lw, fs / ls }'
awk -v lw="$lora_w" -v dw="$delta_w" -v ls="$lm" -v ds="$dm" \
  'BEGIN { printf "lora / lora delta (steps 2 on): %.1fx the bytes on the wire, %.2fx the seconds\n", lw / dw, ls / ds }'

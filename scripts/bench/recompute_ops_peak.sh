#!/usr/bin/env bash
# Peak memory per model.recompute_ops set (docs/training.md "Recomputation", "Per-op recomputation"):
# the quickstart model (3 blocks, C 128, 4 heads, T 48) at micro-batch 32, gpt2 and llama, one
# training step each on one rank. Prints, per run, the allocator's peak (memory_peak_bytes in
# metrics.jsonl) and the header's estimate of the tensors, which should be equal.
#   scripts/bench/recompute_ops_peak.sh [build/tessera] [out dir]
set -euo pipefail
bin=${1:-build/tessera}
out=${2:-/tmp/recompute_ops_peak}
mkdir -p "$out"
printf '%-6s %-22s %14s %14s\n' preset recompute peak_bytes estimate
for preset in gpt2 llama; do
  for set in none selective norm qkv attn mlp_in mlp_act norm+qkv all full; do
    keys=(--set "model.recompute=\"none\"")
    case $set in
      none) ;;
      full) keys=(--set "model.recompute=\"full\"") ;;
      *) keys+=(--set "model.recompute_ops_layers=[\"$set\", \"$set\", \"$set\"]") ;;
    esac
    dir="$out/$preset-$set"
    rm -rf "$dir"
    OMP_NUM_THREADS=1 "$bin" train configs/quickstart.toml --set model.preset=\"$preset\" --set train.steps=1 \
      --set log.every=1 --set train.eval_every=0 --set data.val_examples=16 --set train.global_batch=32 \
      --set train.micro_batch=32 "${keys[@]}" --run-dir "$dir" > "$dir.log" 2>&1
    peak=$(grep -o '"memory_peak_bytes": *[0-9]*' "$dir/metrics.jsonl" | tail -1 | grep -o '[0-9]*$')
    estimate=$(grep -o 'memory estimate: .*' "$dir.log" | head -1)
    printf '%-6s %-22s %14s   %s\n' "$preset" "$set" "$peak" "$estimate"
  done
done

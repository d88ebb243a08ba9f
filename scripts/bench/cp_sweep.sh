#!/usr/bin/env bash
# Context parallelism against sequence length (docs/performance.md): trains a small LLaMA (2 layers,
# C = 128, 4 heads, 2 KV heads) on the addition task for 3 steps of one sequence at each T and cp,
# and prints the allocator's peak per rank and the tokens/s of the last step (metrics.jsonl).
# cp = 1 runs one process with 2 OpenMP threads; cp > 1 runs cp processes under mpiexec with one
# thread each. Usage: scripts/bench/cp_sweep.sh [build/tessera] [T...] (default T: 1024 2048 4096).
set -euo pipefail
bin=${1:-build/tessera}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(1024 2048 4096)
cps=(${CPS:-1 2 4})
dir=$(mktemp -d /tmp/cp_sweep.XXXXXX)
cat > "$dir/m.toml" <<'TOML'
[model]
preset = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 128

[data]
digits = 3
val_examples = 1

[train]
steps = 3
global_batch = 1
micro_batch = 1
eval_every = 0
eval_batches = 1

[optim]
lr = 1e-3
warmup_steps = 1

[log]
every = 1
progress = "lines"
TOML
field() { grep '"tokens_per_s"' "$1" | tail -1 | sed -E "s/.*\"$2\": ([0-9.e+-]+).*/\1/"; }
printf "%6s %3s %14s %12s %16s\n" T cp "peak MiB/rank" "tokens/s" "cp MiB/step"
for T in "${lengths[@]}"; do
  for cp in "${cps[@]}"; do
    run="$dir/T${T}_cp${cp}"
    set_args=(--set "train.seq_len=$T" --set "parallel.cp=$cp")
    if [ "$cp" = 1 ]; then
      OMP_NUM_THREADS=2 "$bin" train "$dir/m.toml" --run-dir "$run" "${set_args[@]}" > "$run.log" 2>&1
    else
      OMP_NUM_THREADS=1 mpiexec -n "$cp" "$bin" train "$dir/m.toml" --run-dir "$run" "${set_args[@]}" > "$run.log" 2>&1
    fi
    m="$run/metrics.jsonl"
    peak=$(field "$m" memory_peak_bytes)
    tps=$(field "$m" tokens_per_s)
    cpb=$( (grep -o '"cp_bytes_per_step": [0-9]*' "$m" || true) | tail -1 | awk '{print $2}')
    awk -v T="$T" -v cp="$cp" -v peak="$peak" -v tps="$tps" -v cpb="${cpb:--1}" 'BEGIN {
      printf "%6s %3s %14.2f %12.1f %16s\n", T, cp, peak / 1048576, tps, cpb < 0 ? "-" : sprintf("%.2f", cpb / 1048576) }' 
  done
done
rm -rf "$dir"

#!/usr/bin/env bash
# Runs the GEMM library comparison behind docs/performance.md "GEMM library choice": the same
# gemm_bench built against OpenBLAS and BLIS, each as the environment is and with OpenBLAS's
# core-type overrides removed, interleaved twice so load drift on a shared machine hits both.
# Usage: scripts/bench/gemm_choice.sh [log dir, default build/bench/logs] [extra gemm_bench args]
set -euo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-build/bench/logs}
shift || true
mkdir -p "$logs"
cmake --build build -j2 --target gemm_bench_openblas gemm_bench_blis

{ date; echo "nproc: $(nproc)"; grep -m1 'model name' /proc/cpuinfo
  flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|fma|avx512f' | sort -u | tr '\n' ' ')
  echo "cpu flags of interest: ${flags}$(grep -q -w avx512f /proc/cpuinfo || echo '(no avx512f)')"
  echo "OPENBLAS_CORETYPE in this environment: ${OPENBLAS_CORETYPE-(unset)}"; } | tee "$logs/machine.txt"

# Percent of CPU time idle over 2 s, from /proc/stat (fields: user nice system idle iowait ...).
idle_percent() {
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep 2
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  echo $(( 100 * (b[4] - a[4]) / (total > 0 ? total : 1) ))
}
# The machine is shared: start each run when it is nearly idle (gives up waiting after 15 min).
wait_quiet() {
  local waited=0 idle
  while idle=$(idle_percent); [ "$idle" -lt 90 ] && [ $waited -lt 900 ]; do waited=$((waited + 2)); done
  echo "machine idle before this run: ${idle}% (waited ${waited}s)"
}

for round in 1 2; do
  for lib in openblas blis; do
    wait_quiet | tee "$logs/${lib}_as_is_$round.txt"
    ./build/bench/gemm_bench_$lib --threads 2 "$@" | tee -a "$logs/${lib}_as_is_$round.txt"
    wait_quiet | tee "$logs/${lib}_unset_$round.txt"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./build/bench/gemm_bench_$lib --threads 2 --no-peak "$@" \
      | tee -a "$logs/${lib}_unset_$round.txt"
  done
done

#!/usr/bin/env bash
# Runs the GEMM library comparison behind docs/performance.md "GEMM library choice": the same
# gemm_bench built against OpenBLAS and BLIS, each with the environment as it is and with
# OpenBLAS's core-type overrides removed, then three more alternating rounds, summarized by
# gemm_summary.py. The machine may be shared, so gemm_bench waits for idle CPUs before each
# measurement (--idle-wait) and reports the CPU share its threads got. Takes 15-60 minutes.
# Usage: scripts/bench/gemm_choice.sh [log dir, default build/bench/logs] [extra gemm_bench args]
set -euo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-build/bench/logs}
shift || true
mkdir -p "$logs"
cmake --build build -j2 --target gemm_bench_openblas gemm_bench_blis
args=(--threads 2 --idle-wait 60 "$@")

{ date -u; echo "nproc: $(nproc)"; grep -m1 'model name' /proc/cpuinfo
  flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|fma|avx512f' | sort -u | tr '\n' ' ')
  echo "cpu flags of interest: ${flags}$(grep -q -w avx512f /proc/cpuinfo || echo '(no avx512f)')"
  echo "OPENBLAS_CORETYPE in this environment: ${OPENBLAS_CORETYPE-(unset)}"; } | tee "$logs/machine.txt"

for lib in openblas blis; do
  ./build/bench/gemm_bench_$lib "${args[@]}" | tee "$logs/${lib}_as_is.txt"
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./build/bench/gemm_bench_$lib "${args[@]}" --no-peak \
    | tee "$logs/${lib}_unset.txt"
done
# What a core-type override costs: Sandybridge kernels have AVX but no FMA.
OPENBLAS_CORETYPE=Sandybridge ./build/bench/gemm_bench_openblas "${args[@]}" --no-peak --no-mixed --tokens 1024 \
  | tee "$logs/openblas_coretype_sandybridge.txt"
# More rounds, libraries alternating, so that one disturbed run does not decide.
for round in 1 2 3; do
  for lib in openblas blis; do
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./build/bench/gemm_bench_$lib "${args[@]}" --no-peak \
      > "$logs/repeat_${lib}_$round.txt"
  done
done
runs() { local l=$1; echo "$logs/${l}_as_is.txt,$logs/${l}_unset.txt,$logs/repeat_${l}_1.txt,$logs/repeat_${l}_2.txt,$logs/repeat_${l}_3.txt"; }
scripts/bench/gemm_summary.py openblas="$(runs openblas)" blis="$(runs blis)" | tee "$logs/summary.md"

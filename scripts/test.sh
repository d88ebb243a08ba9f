#!/usr/bin/env bash
# Builds, then runs the test suite (CTest) against the build in build/. By default every test but
# those labelled `slow` (end-to-end `tessera train` runs of many processes under mpiexec, with
# checkpoints, and the `slurm` test, which starts a one-node Slurm cluster of its own); --slow runs
# only those, --all everything. Other arguments go to ctest, e.g.
#   scripts/test.sh -R Gelu      scripts/test.sh -L kernels      scripts/test.sh --all -L app
#   scripts/test.sh --all -L slurm   (skipped, saying why, without slurm-wlm and munge or root)
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-LE slow)
args=()
for a in "$@"; do
  case "$a" in
    --slow) select=(-L slow) ;;
    --all) select=() ;;
    *) args+=("$a") ;;
  esac
done
t0=$(date +%s)
cmake --build build -j "$(nproc)"
echo "test.sh: built in $(( $(date +%s) - t0 )) s"
# A test without its own TIMEOUT property gets 900 s (ctest's default is 1500 s).
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 "${select[@]}" "${args[@]}"

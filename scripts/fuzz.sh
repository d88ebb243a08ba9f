#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, in build-fuzz/) and runs each for a
# fixed time, one after another; prints a summary. docs/fuzzing.md explains targets and findings.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]     default: 180 s each, every target
#   scripts/fuzz.sh 30 config json                       two targets, 30 s each
#
# Each target grows its own corpus in build-fuzz/fuzz-corpus/<target>/ (kept between runs) from the
# committed seeds in tests/fuzz/corpus/<target>/. A target stops at its first finding (crash,
# sanitizer report, hang over 10 s, memory over 2.5 GiB): the input and the log are kept in
# build-fuzz/findings/<target>/; reproduce with `build-fuzz/tests/fuzz/fuzz_<target> <input>`.
# Exit status 1 when anything was found. Environment: FUZZ_BUILD_DIR (build-fuzz), FUZZ_JOBS
# (build parallelism, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(config json gpt2_vocab gpt2_encode indexed_dataset llmc_shard checkpoint checkpoint_objects)
seconds=${1:-180}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
case "$seconds" in '' | *[!0-9]*) echo "fuzz: seconds must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done

# clang, its libFuzzer/sanitizer runtimes (only recommended by clang-14, so named) and clang's
# OpenMP runtime; the normal build (scripts/setup.sh, GCC) needs none of them.
packages=(clang libclang-rt-14-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

build=${FUZZ_BUILD_DIR:-build-fuzz}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
    -DTESSERA_TESTS=OFF -DTESSERA_CUDA=OFF "${launcher[@]}"
fi
cmake --build "$build" -j "${FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"

# Scratch directories of fuzz runs that have ended (a crash leaves its /dev/shm/tessera_fuzz_*).
clean_scratch() {
  for d in /dev/shm/tessera_fuzz_*; do
    [ -d "$d" ] || continue
    kill -0 "${d##*_}" 2>/dev/null || rm -rf "$d"
  done
}

summary=()
found=0
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  log="$findings/last-run.log"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (log: $log)"
  start=$(date +%s)
  rc=0
  OMP_NUM_THREADS=1 "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 \
    -artifact_prefix="$findings/" -print_final_stats=1 "${dict[@]}" "$corpus" "tests/fuzz/corpus/$t" \
    >"$log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  clean_scratch
  # The last status line: "#<executions> <event> cov: ... corp: <units>/<bytes> ..."
  status=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$status")
  corp=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$status")
  if [ "$rc" -eq 0 ]; then
    result="no findings"
  else
    found=1
    artifact=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$log" | tail -n 1)
    result="FINDING (exit $rc): ${artifact:-see $log}"
  fi
  summary+=("$(printf '%-16s %6ss %12s execs %7s corpus  %s' "$t" "$elapsed" "${execs:-?}" "${corp:-?}" "$result")")
done

echo
echo "fuzz summary ($(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -nE 's/^Model name: *//p' | head -n 1), $(nproc) CPUs):"
printf '  %s\n' "${summary[@]}"
exit "$found"

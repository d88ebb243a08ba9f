#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, in build-fuzz/) and runs each for a
# fixed time, one after another; prints a summary. docs/fuzzing.md explains targets and findings.
#
#   scripts/fuzz.sh [--no-build] [seconds-per-target] [target...]   default: 180 s each, every target
#   scripts/fuzz.sh 30 config json                                   two targets, 30 s each
#
# Each target grows its own corpus in build-fuzz/fuzz-corpus/<target>/ (kept between runs) from the
# committed seeds in tests/fuzz/corpus/<target>/. A target stops at its first finding (crash,
# sanitizer report, an input taking over 10 s, memory over 2.5 GiB), except checkpoint, which keeps
# going (see below). Findings and the log go to build-fuzz/findings/<target>/; each finding is
# re-run once to name where it crashed. Reproduce with `build-fuzz/tests/fuzz/fuzz_<target> FILE`
# (with the environment printed in the log). Exit status 1 when anything was found.
# --no-build: use the targets as built (the ctest smoke runs). Environment: FUZZ_BUILD_DIR
# (build-fuzz), FUZZ_JOBS (build parallelism, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(config json image gpt2_vocab gpt2_encode indexed_dataset llmc_shard checkpoint checkpoint_objects safetensors)
build_targets=1
if [ "${1:-}" = --no-build ]; then
  build_targets=0
  shift
fi
seconds=${1:-180}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
case "$seconds" in '' | *[!0-9]*) echo "fuzz: seconds must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done

build=${FUZZ_BUILD_DIR:-build-fuzz}
if [ "$build_targets" = 1 ]; then
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

  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
      -DTESSERA_TESTS=OFF -DTESSERA_CUDA=OFF "${launcher[@]}"
  fi
  cmake --build "$build" -j "${FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
fi

# Scratch directories of fuzz runs that have ended (a crash leaves its /dev/shm/tessera_fuzz_*).
clean_scratch() {
  for d in /dev/shm/tessera_fuzz_*; do
    [ -d "$d" ] || continue
    kill -0 "${d##*_}" 2>/dev/null || rm -rf "$d"
  done
}

# Options for one target. checkpoint mutates the bytes of real HDF5 files, and HDF5 1.10.8 itself
# misbehaves on some (docs/fuzzing.md): fork mode keeps fuzzing after a crash (each is kept and
# triaged); malloc_fill_byte=0 hides the one known HDF5 bug that would otherwise end nearly every
# job (it frees a pointer read from uninitialized memory after a bad link message); and leaks are
# not checked there, since HDF5 leaks a cache entry on every failed load (checking made it 7x
# slower). checkpoint_objects writes valid files and checks leaks, with whole malloc stacks so
# that tests/fuzz/lsan.supp can tell HDF5's own leak from tessera's.
target_flags() {
  case "$1" in
    checkpoint) echo "-fork=1 -ignore_crashes=1 -detect_leaks=0" ;;
  esac
}
target_asan() {
  case "$1" in
    checkpoint) echo "detect_leaks=0:malloc_fill_byte=0" ;;
    checkpoint_objects) echo "detect_leaks=1:fast_unwind_on_malloc=0" ;;
    *) echo "detect_leaks=1" ;;
  esac
}

# Where a finding crashed: the first stack frame outside the sanitizer runtime, libFuzzer and libc
# (a tessera source line, or a library such as libhdf5), or the sanitizer's one-line report.
triage() {
  local exe=$1 input=$2 out
  out=$(timeout 120 "$exe" -timeout=10 -rss_limit_mb=2560 "$input" 2>&1 || true)
  local frame
  frame=$(grep -E '^ +#[0-9]+ ' <<<"$out" | grep -vE '__asan|__interceptor|__sanitizer|__ubsan|libucs|fuzzer::|libc\.so|nptl/|abort|raise|tessera::fuzz::|/fuzz_[a-z_0-9]+\+0x' |
    head -n 1 | sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ (in )?//; s/ \(BuildId.*//')
  local what
  what=$(grep -m 1 -oE 'FUZZ FINDING: .{0,100}|[^ ]*: runtime error: .{0,100}|ERROR: [A-Za-z]+Sanitizer: [A-Za-z-]+( on| in)?|ERROR: libFuzzer: [a-z-]+' <<<"$out" || true)
  [ -z "$what" ] && what="does not reproduce alone"
  echo "$what${frame:+ at $frame}"
}

summary=()
found=0
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1"
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  log="$findings/last-run.log"
  exe="$build/tests/fuzz/fuzz_$t"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  # shellcheck disable=SC2207
  flags=($(target_flags "$t"))
  export ASAN_OPTIONS="$(target_asan "$t")"
  echo "fuzz: $t for ${seconds}s (log: $log)"
  marker="$findings/.started"
  touch "$marker"
  start=$(date +%s)
  rc=0
  {
    echo "LSAN_OPTIONS=$LSAN_OPTIONS ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS OMP_NUM_THREADS=1"
    OMP_NUM_THREADS=1 "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 \
      -artifact_prefix="$findings/" -print_final_stats=1 "${flags[@]}" "${dict[@]}" "$corpus" "tests/fuzz/corpus/$t" 2>&1
  } >"$log" || rc=$?
  elapsed=$(($(date +%s) - start))
  clean_scratch
  # The last status line: "#<executions> <event> cov: ... corp: <units>/<bytes> ..." (fork mode:
  # "#<executions>: cov: ... corp: <units> ...").
  status=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$status")
  corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$status")
  mapfile -t new < <(find "$findings" -maxdepth 1 -type f -newer "$marker" \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) -size +0 | sort)
  rm -f "$marker"
  if [ ${#new[@]} -eq 0 ] && { [ "$rc" -eq 0 ] || [ ${#flags[@]} -gt 0 ]; }; then
    result="no findings"
  else
    found=1
    result="${#new[@]} finding(s), exit $rc"
  fi
  summary+=("$(printf '%-18s %5ss %10s execs %6s corpus  %s' "$t" "$elapsed" "${execs:-?}" "${corp:-?}" "$result")")
  for f in "${new[@]}"; do
    summary+=("    $f: $(triage "$exe" "$f")")
  done
done

echo
echo "fuzz summary ($(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -nE 's/^Model name: *//p' | head -n 1), $(nproc) CPUs):"
printf '  %s\n' "${summary[@]}"
exit "$found"

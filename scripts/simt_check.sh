#!/usr/bin/env bash
# The whole CUDA path on the CPU (docs/cuda.md, "The SIMT emulator"), in one command:
#   build     build-simt/ (-DTESSERA_SIMT=ON): tessera and the emulator, GPU and twin tests
#   emulator  the emulator's own tests (tests_simt) and the twins' (runtime, cuBLASLt, CUB; NCCL on 2 ranks)
#   asan      build-simt-asan/ (kernels only, AddressSanitizer + UBSan): every op case, the CUDA
#             attention and GEMM tests, and the coverage list ("kernels exercised: X of Y")
#   tsan      build-simt-tsan/ (kernels only, ThreadSanitizer; every emulated thread a TSan fiber):
#             all of tests_gpu (every op case at every shape, attention, GEMMs), and a deliberately missing __syncthreads and a race between two blocks,
#             which must be reported
#   layouts   mpiexec -n 2 build-simt/tessera train configs/quickstart.toml on dp2, tp2+sp, pp2
#             (1f1b) and cp2, train.device = "cuda" against "cpu", f32 and bf16, 20 steps; a
#             checkpoint written on the emulated device resumed on the CPU and the reverse
#   gpu-app   the `gpu` tests of tessera train and of `tessera plan --calibrate` (2 ranks) on the
#             emulated device (tests_gpu_app)
# Prints one line per stage and a last line "simt_check: N passed, M failed"; exits non-zero on
# any failure. Options: --ops (build, emulator and asan only: what a kernel edit needs),
# --jobs N (build parallelism, default nproc), --keep-going, --stream (each stage's output to the
# terminal as well as its log: CI, whose report shows the tail of what ran).
# Every test binary runs under a watchdog (SIMT_TEST_TIMEOUT seconds, default 1800): one that has
# not finished by then is stopped with SIGABRT (AddressSanitizer prints the stack where it waited)
# and the stage fails naming the test that was running.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

ops_only=0
jobs=$(nproc)
keep_going=0
stream=0
test_timeout=${SIMT_TEST_TIMEOUT:-1800}
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) ops_only=1 ;;
    --jobs) jobs="$2"; shift ;;
    --keep-going) keep_going=1 ;;
    --stream) stream=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "simt_check: unknown argument '$1' (expected --ops, --jobs N, --keep-going, --stream)" >&2; exit 2 ;;
  esac
  shift
done

LOG_DIR=${SIMT_CHECK_LOGS:-$ROOT/build-simt/check-logs}
mkdir -p "$LOG_DIR"
passed=0
failed=0
summary=()
t_all=$(date +%s)

# stage NAME COMMAND...: runs it with its output in $LOG_DIR/NAME.log, records one line.
stage() {
  local name=$1
  shift
  local t0 log="$LOG_DIR/$name.log"
  t0=$(date +%s)
  echo "simt_check: $name ..."
  local rc
  if [ "$stream" = 1 ]; then
    "$@" 2>&1 | tee "$log" | sed -u "s/^/  $name| /"
    rc=${PIPESTATUS[0]}
  else
    "$@" >"$log" 2>&1
    rc=$?
  fi
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    local extra
    extra=$(grep -h "^simt_check-note:" "$log" | sed 's/^simt_check-note: //' | paste -sd ';' -)
    summary+=("simt_check: $name passed in $(( $(date +%s) - t0 )) s${extra:+ ($extra)}")
    echo "${summary[-1]}"
    return 0
  fi
  failed=$((failed + 1))
  summary+=("simt_check: $name FAILED in $(( $(date +%s) - t0 )) s (log: $log)")
  echo "${summary[-1]}"
  tail -n 40 "$log" | sed 's/^/  | /'
  if [ "$keep_going" = 0 ]; then finish; fi
  return 1
}

finish() {
  echo
  printf '%s\n' "${summary[@]}"
  echo "simt_check: total $(( $(date +%s) - t_all )) s"
  echo "simt_check: $passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit $?
}

configure_build() {  # dir, cmake args..., then -- targets...
  local dir=$1
  shift
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DTESSERA_SIMT=ON "${args[@]}" &&
    cmake --build "$dir" -j "$jobs" --target "$@"
}

# watched COMMAND...: runs a test binary under the watchdog; on a timeout names the test that was
# running (gtest's last "[ RUN      ]" without its end) and fails.
watched() {
  local out rc
  out=$(mktemp)
  timeout -s ABRT -k 60 "$test_timeout" "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ]; then
    echo "simt_check: $(basename "$1") did not finish in $test_timeout s (SIMT_TEST_TIMEOUT); the last test started:"
    grep -E "^\[ RUN      \]" "$out" | tail -n 1
  fi
  rm -f "$out"
  return "$rc"
}

build_main() {
  if [ "$ops_only" = 1 ]; then  # tests_gpu runs in the asan stage, from its own build
    configure_build build-simt -- tests_simt tests_simt_nccl
  else
    configure_build build-simt -- tessera tests_simt tests_simt_nccl tests_gpu tests_gpu_app tests_gpu_parallel
  fi
}

emulator_tests() {
  watched build-simt/tests/tests_simt --gtest_brief=1 || return 1
  OMP_NUM_THREADS=1 watched mpiexec -n 2 build-simt/tests/tests_simt_nccl --gtest_brief=1
}

# Every CUDA kernel test on the emulator (op cases, attention, GEMM, runtime), with the coverage of
# __global__ kernels: each launched at least once.
gpu_kernel_tests() {  # build dir
  local dir=$1 cov
  cov=$(mktemp)
  local out
  out=$(TESSERA_SIMT_COVERAGE=$cov OMP_NUM_THREADS=1 watched "$dir/tests/tests_gpu" 2>&1)
  local rc=$?
  grep -E "^\[  (FAILED|SKIPPED) |^\[==========\]|^\[  PASSED  \]|runtime error|ERROR: AddressSanitizer" <<<"$out"
  if [ $rc != 0 ]; then
    echo "$out" | tail -n 60
    rm -f "$cov"
    return 1
  fi
  # Every GPU test runs on the emulator: one that skipped (no device, no kernel) would hide a kernel.
  if grep -q "^\[  SKIPPED \]" <<<"$out"; then
    echo "tests_gpu skipped tests on the emulator (each must run here)"
    rm -f "$cov"
    return 1
  fi
  local list=$dir/kernels/simt_src/kernels.txt
  local total exercised missing
  total=$(wc -l <"$list")
  exercised=$(sort -u "$cov" | grep -cxFf "$list")
  missing=$(sort -u "$cov" | grep -vxFf - "$list" | paste -sd ' ' -)
  rm -f "$cov"
  echo "simt_check-note: kernels exercised: $exercised of $total"
  if [ "$exercised" -lt "$total" ]; then
    echo "kernels never launched by a test: $missing"
    return 1
  fi
}

# AddressSanitizer + UBSan: stop at the first report; leaks checked, less matmul.cu's handle cache.
SAN_ENV=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:handle_abort=1 "LSAN_OPTIONS=suppressions=$ROOT/scripts/simt_lsan.supp"
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

asan_stage() {
  configure_build build-simt-asan -DTESSERA_KERNELS_ONLY=ON -DTESSERA_SIMT_SANITIZE=address,undefined -DTESSERA_NATIVE=ON \
    -- tests_gpu tests_simt || return 1
  (export "${SAN_ENV[@]}" && watched build-simt-asan/tests/tests_simt --gtest_brief=1) || return 1
  (export "${SAN_ENV[@]}" && gpu_kernel_tests build-simt-asan)
}

tsan_stage() (  # a subshell: its environment stays here
  # MPICH's UCX hooks madvise at every thread's exit, which crashes under ThreadSanitizer (the
  # library, not tessera: the NCCL twin links MPI into every binary of the emulator).
  export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
  configure_build build-simt-tsan -DTESSERA_KERNELS_ONLY=ON -DTESSERA_SIMT_SANITIZE=thread -- tests_gpu tests_simt ||
    return 1
  TSAN_OPTIONS=halt_on_error=1 build-simt-tsan/tests/tests_simt --gtest_brief=1 || return 1
  # The deliberate races must be reported (else the stage proves nothing): a missing
  # __syncthreads, and two blocks of a grid writing one word.
  local demo out
  for demo in MissingBarrier TwoBlocksWriteOneWord; do
    out=$(TESSERA_SIMT_RACE_DEMO=1 TSAN_OPTIONS=halt_on_error=0 build-simt-tsan/tests/tests_simt \
      --gtest_filter=SimtRaceDemo.$demo 2>&1)
    if ! grep -q "WARNING: ThreadSanitizer: data race" <<<"$out"; then
      echo "ThreadSanitizer did not report the race of SimtRaceDemo.$demo:"
      echo "$out"
      return 1
    fi
  done
  echo "simt_check-note: a missing __syncthreads and a race between blocks are reported"
  # All of tests_gpu: the op-case list at its small and large shapes and the attention and GEMM
  # tests (57 tests; 117 s of CPU on 2 cores beside other work, docs/cuda.md). SIMT_TSAN_FILTER
  # narrows it, e.g. SIMT_TSAN_FILTER='CudaOpCases/*'.
  TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 build-simt-tsan/tests/tests_gpu --gtest_brief=1 \
    --gtest_filter="${SIMT_TSAN_FILTER:-*}"
)

layouts_stage() {
  /usr/bin/python3 scripts/simt_layouts.py --tessera build-simt/tessera --work "$LOG_DIR/layouts"
}

gpu_app_stage() {
  OMP_NUM_THREADS=1 build-simt/tests/tests_gpu_app --gtest_brief=1
}

stage build build_main
stage emulator emulator_tests
stage asan asan_stage
if [ "$ops_only" = 0 ]; then
  stage tsan tsan_stage
  stage layouts layouts_stage
  stage gpu-app gpu_app_stage
fi
finish

#!/usr/bin/env bash
# One command for a GPU machine (docs/cuda.md, "gpu_check.sh"): builds tessera with the CUDA
# backend, runs the `gpu` tests, calibrates the GPU for the planner (`tessera plan --calibrate
# --device cuda`, the file kept in the logs), times the CUDA attention beside PyTorch's SDPA, then GPT-2 124M
# and 350M training in bf16 (tessera train, train.device = "cuda") beside the same model in
# PyTorch (eager and torch.compile), and prints a summary table, within about 8 minutes on an
# H200 (every stage has a time limit; the summary prints whatever ran). Made for a machine with
# nvcc 13, CMake, ninja (or make) and a Python with PyTorch, but none of Debian's -dev packages
# and no network:
#  * MPICH, parallel HDF5, toml++, CLI11, nlohmann/json, libpng, libjpeg, zlib, OpenBLAS (OpenMP) and GoogleTest
#    come from the system when it has them all, else from the .deb files of .gpu-deps/ (fetched
#    beforehand with scripts/gpu_deps.sh where Debian's registry is reachable, carried along with
#    the tree, never committed), unpacked with dpkg -x into a prefix in /tmp; the binaries find
#    those libraries through an RPATH into the prefix (nothing is installed into /usr);
#  * cuDNN and NCCL (the CUDA backend links them) from the CUDA toolkit, else from the Python
#    environment's nvidia-cudnn / nvidia-nccl wheels;
#  * it builds the full tree (-DTESSERA_CUDA=ON, sm_90): first `tessera`, the gpu test programs
#    and the benchmarks, the GPU stages run, then the rest of the tests if time is left. If the
#    full configure or build fails it says so and falls back to a TESSERA_KERNELS_ONLY tree (the
#    kernels layer, tests_gpu, attention_cuda_bench: no MPI, HDF5, CLI11 or toml++).
# Without a GPU it builds, runs the gpu tests (which report SKIPPED), says so and exits 3: nothing
# was verified on a GPU. Exit 0: everything that could run ran and passed (a row "not run: ..."
# says what could not, e.g. the trainer refusing train.device = "cuda"); 1: a stage failed or
# timed out.
#   scripts/gpu_check.sh                 (logs in $OUT if set, else build-gpu/gpu_check/)
#   TESSERA_GPU_DEPS=debs scripts/gpu_check.sh   (use .gpu-deps even where the system has the
#                                                 packages: the rehearsal of the GPU machine's path)
# Settings (environment): TESSERA_GPU_BUDGET (seconds for the whole script, default 480),
# TESSERA_GPU_KERNELS_ONLY=1 (skip the full build), TESSERA_CUDA_ARCH (default 90),
# TESSERA_BENCH_124M / TESSERA_BENCH_350M (micro-batch sizes, default "8 16 32" / "4 8 16"),
# TESSERA_BENCH_STEPS (default 12, of which the first 4 are warm-up), TESSERA_PEAK_TFLOPS
# (MFU's denominator, default 989: the H100/H200 SXM dense bf16 peak, docs/performance.md),
# TESSERA_GPU_TIME_SCALE (multiplies every stage's time cap; default 1).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TESSERA_GPU_BUILD:-$root/build-gpu}
logs=${OUT:-$build/gpu_check}
mkdir -p "$build" "$logs"
log=$logs/gpu_check.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
t_start=$(date +%s)
budget=${TESSERA_GPU_BUDGET:-480}
elapsed() { echo $(( $(date +%s) - t_start )); }
left() { echo $(( budget - $(elapsed) )); }
# stage_limit CAP RESERVE: seconds a stage may take: CAP, or what is left minus RESERVE (the time
# the stages after it need at least), whichever is smaller; 0 when nothing is left.
# TESSERA_GPU_TIME_SCALE multiplies the caps (a rehearsal on 2 cores: scripts/gpu_check_rehearse.sh).
scale=${TESSERA_GPU_TIME_SCALE:-1}
# Never below 1 (timeout 0 would mean no limit); a stage given less than 10 s is not started.
stage_limit() { local c=$(( $1 * scale )) l=$(( $(left) - $2 )); [ "$l" -lt 1 ] && l=1; [ "$l" -gt "$c" ] && l=$c; echo "$l"; }
# CPU seconds (user + sys) of the finished child processes so far: a build's difference, divided by
# the cores of another machine, estimates its build time there (docs/cuda.md, "gpu_check.sh").
# (times runs in this shell, not a subshell, whose children would be none.)
snap_cpu() { times >"$logs/.times"; }
read_cpu() { tail -1 "$logs/.times" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += 60 * a[1] + a[2] } printf "%d", s }'; }
declare -a summary=()
add() { summary+=("$(printf '%-30s %s' "$1" "$2")"); }
failed_any=0
declare -a tables=()
finish() {
  say ""
  for t in "${tables[@]}"; do say "$t"; say ""; done
  say "== gpu_check summary ($(elapsed) s of a ${budget} s budget) =="
  for line in "${summary[@]}"; do say "$line"; done
  exit "$1"
}

# ---- tools ----
export PATH=$PATH:/usr/local/cuda/bin
for tool in nvcc cmake; do
  command -v $tool >/dev/null || { say "gpu_check: $tool not found"; add "tools" "FAILED: no $tool"; finish 1; }
done
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
command -v ccache >/dev/null && generator+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
python=${PYTHON:-python3}
"$python" -c "import torch" 2>/dev/null || { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2>/dev/null && python=/usr/bin/python3; }
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
jobs=$(nproc)
say "gpu_check: $(nvcc --version | tail -1), $(cmake --version | head -1), python $python, $jobs cores, budget $budget s"
python_env_ld=${LD_LIBRARY_PATH:-}  # Python runs with the caller's library path, never the prefix's

# ---- dependencies ----
multiarch=x86_64-linux-gnu
prefix=${TESSERA_GPU_PREFIX:-/tmp/tessera-gpu-prefix}
kernel_args=()  # what the kernels-only tree needs: OpenBLAS, GoogleTest, cuDNN, NCCL
full_args=()    # and what the full tree needs besides: MPI, HDF5 (toml++, CLI11, PNG, JPEG through the prefix path)
host_includes=""  # the prefix's multiarch include folder (jconfig.h), which the compiler searches only under /usr
prefix_ld=""    # the prefix's library folders: only mpiexec.hydra needs them (through a wrapper); the built programs have an RPATH
have_system_deps() {
  local f
  for f in /usr/include/$multiarch/openblas-openmp/cblas.h /usr/lib/$multiarch/cmake/GTest/GTestConfig.cmake \
           /usr/include/$multiarch/mpich/mpi.h /usr/include/hdf5/mpich/hdf5.h /usr/include/toml++/toml.h \
           /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/png.h /usr/include/jpeglib.h; do
    [ -f "$f" ] || return 1
  done
}
if [ "${TESSERA_GPU_DEPS:-auto}" != debs ] && have_system_deps; then
  say "gpu_check: MPICH, HDF5, toml++, CLI11, PNG, JPEG, OpenBLAS and GoogleTest from the system"
  deps_from="system"
else
  debs=("$root"/.gpu-deps/*.deb)
  if [ ! -f "${debs[0]}" ]; then
    say "gpu_check: the system lacks some of MPICH, HDF5, toml++, CLI11, PNG, JPEG, OpenBLAS, GoogleTest and there is no .gpu-deps/*.deb: run scripts/gpu_deps.sh where Debian's registry is reachable, and carry .gpu-deps"
    add "dependencies" "FAILED: .gpu-deps missing"
    finish 1
  fi
  t0=$(date +%s)
  rm -rf "$prefix" && mkdir -p "$prefix"
  unpack() {  # dpkg -x, or where there is no dpkg, the .deb's data.tar.xz through ar and tar
    if command -v dpkg >/dev/null; then dpkg -x "$1" "$prefix"
    else ar p "$1" data.tar.xz | tar -xJ -C "$prefix"; fi
  }
  for d in "${debs[@]}"; do unpack "$d" || { add "dependencies" "FAILED: unpacking $d"; finish 1; }; done
  # Absolute links (libz.so -> /lib/...) point into the prefix instead; the -dev package's
  # libopenblas.so is an absolute link into /usr too.
  while IFS= read -r l; do
    t=$(readlink "$l")
    [ -e "$prefix$t" ] && ln -sfn "$prefix$t" "$l"
  done < <(find "$prefix" -type l -lname '/*')
  lib=$prefix/usr/lib/$multiarch
  ln -sf "$lib/openblas-openmp/libopenblas.so.0" "$lib/openblas-openmp/libopenblas.so"
  # h5pcc links -lcurl -lcrypto -lsz: the links a -dev package would bring (libcurl.so -> libcurl.so.4).
  for so in "$lib"/lib*.so.[0-9]* "$prefix"/lib/$multiarch/lib*.so.[0-9]*; do
    [ -e "$so" ] || continue
    base=${so%%.so.*}.so
    [ -e "$base" ] || ln -s "$(basename "$so")" "$base"
  done
  # The MPI and HDF5 compiler wrappers (FindMPI and FindHDF5 ask them for flags) name /usr.
  for w in "$prefix"/usr/bin/mpicc.mpich "$prefix"/usr/bin/mpicxx.mpich "$prefix"/usr/bin/h5pcc.mpich; do
    [ -f "$w" ] && sed -i -e "s#^\(prefix\|exec_prefix\|includedir\|libdir\)=\(\"\?\)/usr#\1=\2$prefix/usr#" \
                          -e "s#-L/usr/lib#-L$lib#g" "$w"
  done
  prefix_ld=$lib:$lib/openblas-openmp:$prefix/lib/$multiarch
  host_includes="-isystem $prefix/usr/include/$multiarch"
  # mpiexec.hydra and hydra_pmi_proxy have no RPATH: a wrapper gives them (and only them, and the
  # ranks they start) the prefix's libraries, so that cmake, ctest and Python never load them.
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
    "$prefix_ld" "$prefix/usr/bin/mpiexec.hydra" >"$prefix/usr/bin/mpiexec"
  chmod +x "$prefix/usr/bin/mpiexec"
  rpath="$lib:$lib/openblas-openmp:$prefix/lib/$multiarch"
  kernel_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr;$prefix" -DCBLAS_INCLUDE_DIR="$prefix/usr/include/$multiarch/openblas-openmp"
                -DBLAS_LIBRARY="$lib/openblas-openmp/libopenblas.so" -DTESSERA_DNNL=OFF
                -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath-link,$rpath -Wl,-rpath,$rpath")
  full_args+=(-DMPI_C_COMPILER="$prefix/usr/bin/mpicc.mpich" -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.mpich"
              -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec"
              -DHDF5_C_COMPILER_EXECUTABLE="$prefix/usr/bin/h5pcc.mpich")
  export PATH=$prefix/usr/bin:$PATH  # h5pcc calls mpicc.mpich; mpiexec.hydra finds hydra_pmi_proxy
  export HDF5_LDFLAGS="-Wl,-rpath-link,$rpath"  # FindHDF5 links a test program with h5pcc: libmpich's own needs
  deps_from=".gpu-deps (${#debs[@]} .deb files, $(du -sm "$root/.gpu-deps" | cut -f1) MiB) in $prefix"
  say "gpu_check: dependencies from $deps_from ($(( $(date +%s) - t0 )) s)"
fi

# ---- cuDNN and NCCL: the toolkit's, else the Python environment's wheels ----
find_in_python() {  # $1: file name pattern; prints the first match under the site-packages' nvidia/
  LD_LIBRARY_PATH=$python_env_ld "$python" - "$1" <<'EOF' 2>/dev/null
import glob, os, site, sys
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for hit in sorted(glob.glob(os.path.join(base, "nvidia", "**", sys.argv[1]), recursive=True)):
        print(hit); sys.exit(0)
EOF
}
extra_includes=""
for libname in cudnn nccl; do
  header=$libname.h
  if ls "$cuda_root"/lib64/lib$libname.so >/dev/null 2>&1 && [ -f "$cuda_root/include/$header" ]; then continue; fi
  so=$(find_in_python "lib$libname.so*")
  inc=$(find_in_python "$header")
  if [ -z "$so" ] || [ -z "$inc" ]; then
    say "gpu_check: $libname not found in $cuda_root nor in $python's nvidia packages"
    add "dependencies" "FAILED: no $libname"
    finish 1
  fi
  mkdir -p "$prefix/cuda-libs"
  ln -sf "$so" "$prefix/cuda-libs/lib$libname.so"
  upper=$(echo $libname | tr a-z A-Z)
  kernel_args+=(-D${upper}_LIBRARY="$prefix/cuda-libs/lib$libname.so")
  extra_includes="$extra_includes -I$(dirname "$inc")"
  export LD_LIBRARY_PATH=$(dirname "$so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "gpu_check: $libname from $(dirname "$so")"
done
[ -n "$extra_includes$host_includes" ] && kernel_args+=(-DCMAKE_CXX_FLAGS="$host_includes$extra_includes" -DCMAKE_C_FLAGS="$host_includes")
[ -n "$extra_includes" ] && kernel_args+=(-DCMAKE_CUDA_FLAGS="$extra_includes")
add "dependencies" "${deps_from}"
# What the built programs run with: the caller's library path and cuDNN/NCCL's folders (the
# prefix's libraries come through the programs' RPATH and the mpiexec wrapper).
run_env=(env)

# ---- build: the full tree, else the kernels-only one ----
arch=${TESSERA_CUDA_ARCH:-90}
common_args=(-DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
             -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
full=0
kernels_built=0
tessera_bin=""
if [ "${TESSERA_GPU_KERNELS_ONLY:-0}" != 1 ]; then
  t0=$(date +%s)
  say "gpu_check: configuring the full tree in $build (CUDA arch $arch)"
  rm -f "$build/CMakeCache.txt"  # no cached find results of another machine or attempt
  if cmake -S "$root" -B "$build" "${generator[@]}" "${common_args[@]}" -DTESSERA_KERNELS_ONLY=OFF \
       "${kernel_args[@]}" "${full_args[@]}" >>"$log" 2>&1; then
    # First what the GPU stages need: tessera, the gpu test programs, the benchmarks.
    gpu_targets=(tessera attention_cuda_bench)
    for t in $(cmake --build "$build" --target help 2>/dev/null | sed -n 's/^\(tests_gpu[a-z_]*\):.*/\1/p; s/^\.\.\. \(tests_gpu[a-z_]*\).*/\1/p'); do
      gpu_targets+=("$t")
    done
    limit=$(stage_limit 300 150)
    say "gpu_check: building ${gpu_targets[*]} ($jobs jobs, at most $limit s)"
    snap_cpu; cpu0=$(read_cpu)
    timeout "$limit" cmake --build "$build" -j "$jobs" --target "${gpu_targets[@]}" >>"$log" 2>&1
    rc=$?
    snap_cpu
    if [ $rc -eq 0 ]; then
      full=1
      tessera_bin=$build/tessera  # app/CMakeLists.txt: RUNTIME_OUTPUT_DIRECTORY is the build root
      [ -x "$tessera_bin" ] || tessera_bin=$(find "$build" -maxdepth 2 -name tessera -type f -perm -u+x | head -1)
      add "build (full, gpu targets)" "ok ($(( $(date +%s) - t0 )) s, $(( $(read_cpu) - cpu0 )) CPU s, $jobs jobs: ${gpu_targets[*]})"
    else
      grep -E "error|Error" "$log" | tail -20
      [ $rc -eq 124 ] && why="timed out after $limit s" || why="failed (see $log)"
      add "build (full, gpu targets)" "FAILED: $why; falling back to the kernels' targets"
      failed_any=1
      # The kernels' own targets in the same tree reuse what was compiled (a compile error in
      # app/ or model/ does not stop them).
      limit=$(stage_limit 200 60)
      if [ "$limit" -ge 20 ] && timeout "$limit" cmake --build "$build" -j "$jobs" --target tests_gpu attention_cuda_bench >>"$log" 2>&1; then
        kernels_built=1
        add "build (kernels' targets)" "ok ($(( $(date +%s) - t0 )) s since configure)"
      else
        add "build (kernels' targets)" "FAILED or no time left: trying the kernels-only tree"
      fi
    fi
  else
    tail -30 "$log"
    add "configure (full)" "FAILED (see $log); falling back to the kernels-only tree"
    failed_any=1
  fi
fi
if [ $full -eq 0 ] && [ $kernels_built -eq 0 ]; then
  build=$build-kernels
  t0=$(date +%s)
  say "gpu_check: configuring $build (TESSERA_KERNELS_ONLY, CUDA arch $arch)"
  rm -f "$build/CMakeCache.txt"
  if ! cmake -S "$root" -B "$build" "${generator[@]}" "${common_args[@]}" -DTESSERA_KERNELS_ONLY=ON \
       "${kernel_args[@]}" >>"$log" 2>&1; then
    tail -30 "$log"
    add "configure (kernels only)" "FAILED (see $log)"
    finish 1
  fi
  limit=$(stage_limit 300 60)
  if ! timeout "$limit" cmake --build "$build" -j "$jobs" --target tests_gpu attention_cuda_bench >>"$log" 2>&1; then
    grep -E "error|Error" "$log" | tail -20
    add "build (kernels only)" "FAILED (see $log)"
    finish 1
  fi
  add "build (kernels only)" "ok ($(( $(date +%s) - t0 )) s, $jobs jobs)"
fi
say "gpu_check: built at $(elapsed) s"

# ---- the rest of the full tree (every test program), if time is left ----
build_rest() {
  [ $full -eq 1 ] || return 0
  local limit t0 rc n_gpu
  limit=$(stage_limit 240 0)
  if [ "$limit" -lt 20 ]; then add "build (full, everything)" "not run: time budget spent"; return 0; fi
  t0=$(date +%s)
  snap_cpu; cpu0=$(read_cpu)
  timeout "$limit" cmake --build "$build" -j "$jobs" >>"$log" 2>&1
  rc=$?
  snap_cpu
  if [ $rc -eq 0 ]; then
    n_gpu=$(cd "$build" && "${run_env[@]}" ctest -N -L gpu 2>/dev/null | sed -n 's/^Total Tests: //p')
    add "build (full, everything)" "ok ($(( $(date +%s) - t0 )) s, $(( $(read_cpu) - cpu0 )) CPU s; the whole tree has ${n_gpu:-?} gpu tests)"
  else
    add "build (full, everything)" "not finished: $([ $rc -eq 124 ] && echo "timed out after $limit s" || echo "FAILED (see $log)")"
    [ $rc -ne 124 ] && failed_any=1
  fi
}

# ---- gpu tests (they skip, and say so, where no GPU is visible) ----
run_gpu_tests() {  # $1: summary row name
  local t0 out rc skipped failed passed limit
  t0=$(date +%s)
  limit=$(stage_limit 150 170)
  out=$(cd "$build" && timeout "$limit" "${run_env[@]}" ctest -L gpu --timeout 100 --output-on-failure 2>&1)
  rc=$?
  echo "$out" >>"$log"
  echo "$out" | tail -25
  skipped=$(echo "$out" | grep -c "\*\*\*Skipped")
  failed=$(echo "$out" | grep -cE "\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run")
  passed=$(echo "$out" | grep -cE "Test +#[0-9]+: .* +Passed")
  [ $rc -ne 0 ] && [ $failed -eq 0 ] && failed=1
  [ $failed -ne 0 ] && failed_any=1
  add "$1" "$passed passed, $failed failed, $skipped skipped ($(( $(date +%s) - t0 )) s$([ $rc -eq 124 ] && echo ", TIMED OUT"))"
}
"${run_env[@]}" "$build/bench/attention_cuda_bench" --probe 2>&1 | tee -a "$log"
gpu_rc=${PIPESTATUS[0]}
run_gpu_tests "gpu tests (ctest -L gpu)"

if [ "$gpu_rc" -ne 0 ]; then
  say "gpu_check: NO GPU visible: built, and the gpu tests reported SKIPPED; nothing was verified on a GPU"
  add "attention benchmark" "not run: no GPU"
  add "GPT-2 benchmark" "not run: no GPU"
  build_rest
  add "GPU verified" "NO: nothing was run on a GPU"
  finish 3
fi
"$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && torch_cuda=1 || torch_cuda=0

# ---- calibration: `tessera plan --calibrate` on the GPU (GPT-2 124M's shapes, bf16 and fp32), then a
# plan for that one GPU that reads the file (one rank: no link is measured, the file keeps the local
# defaults for them); the file lands in the logs, for later plans ----
calibrate_gpu() {
  local limit t0 out rc file=$logs/cluster_cuda.toml
  limit=$(stage_limit 60 150)
  if [ $full -eq 0 ]; then add "calibration (cuda)" "not run: no full build (kernels-only fallback)"; return; fi
  if [ "$limit" -lt 20 ]; then add "calibration (cuda)" "not run: time budget spent"; return; fi
  t0=$(date +%s)
  say "gpu_check: tessera plan --calibrate configs/gpt2-124m.toml --device cuda (at most $limit s)"
  out=$(cd "$logs" && timeout "$limit" "${run_env[@]}" "$tessera_bin" plan --calibrate "$root/configs/gpt2-124m.toml" \
        --device cuda --set train.global_batch=8 --set calibrate.min_seconds=0.01 --out "$file" 2>&1)
  rc=$?
  echo "$out" | tee -a "$log"
  if [ $rc -ne 0 ]; then
    add "calibration (cuda)" "$([ $rc -eq 124 ] && echo "TIMED OUT after $limit s" || echo "FAILED (rc $rc, see $log)")"
    failed_any=1
    return
  fi
  out=$(cd "$logs" && timeout 30 "${run_env[@]}" "$tessera_bin" plan "$root/configs/gpt2-124m.toml" --gpus 1 \
        --cluster "$file" --set train.device='"cuda"' --top 3 2>&1)
  rc=$?
  echo "$out" | tee -a "$log"
  if [ $rc -ne 0 ]; then
    add "calibration (cuda)" "FAILED: the plan with $file (rc $rc, see $log)"
    failed_any=1
    return
  fi
  add "calibration (cuda)" "ok ($(( $(date +%s) - t0 )) s): $file; $(grep -m1 '^device_name' "$file" | cut -d= -f2-)"
}
calibrate_gpu

# ---- attention benchmark: tessera beside torch SDPA, same shapes, same run ----
limit=$(stage_limit 40 150)
bench_out="" bench_rc=skip
if [ "$limit" -ge 10 ]; then
  bench_out=$(timeout "$limit" "${run_env[@]}" "$build/bench/attention_cuda_bench" 2>&1)
  bench_rc=$?
  echo "$bench_out" | tee -a "$log"
fi
torch_out=""
if [ $torch_cuda -eq 1 ]; then
  limit=$(stage_limit 30 140)
  torch_out=$(LD_LIBRARY_PATH=$python_env_ld timeout "$limit" "$python" "$root/scripts/bench/attention_cuda_torch.py" 2>&1)
  echo "$torch_out" | tee -a "$log"
else
  torch_out="torch with CUDA not available to $python"
  say "gpu_check: $torch_out"
fi
case $bench_rc in 0) add "attention benchmark" "ok" ;; skip) add "attention benchmark" "not run: time budget spent" ;; 124) add "attention benchmark" "TIMED OUT"; failed_any=1 ;;
  *) add "attention benchmark" "FAILED (rc $bench_rc)"; failed_any=1 ;; esac
table=$(printf '%s\n%s\n' "$bench_out" "$torch_out" | awk '$1 == "RESULT" {
  printf "| %-10s | %4s | %8.3f | %8.3f | %8.1f | %8.1f | %8.1f |\n", $2, $3, $4, $5, $6, $7, $8 }')
tables+=("$(printf '%s\n%s\n%s' "== attention, causal, bf16, B 4, T 4096, hidden 2048 (TFLOP/s by FlashAttention's count) ==" \
  "| impl       |    D |   fwd ms |   bwd ms | fwd TF/s | bwd TF/s | f+b TF/s |" "$table")")

# ---- GPT-2 124M and 350M, bf16, T 1024: tessera train beside PyTorch eager and torch.compile ----
peak=${TESSERA_PEAK_TFLOPS:-989}
steps=${TESSERA_BENCH_STEPS:-12}
gpt_args=(--seq 1024 --steps "$steps" --warmup 4 --peak-tflops "$peak"
          --batches-124m "${TESSERA_BENCH_124M:-8 16 32}" --batches-350m "${TESSERA_BENCH_350M:-4 8 16}")
gpt_out=""
limit=$(stage_limit 130 60)
if [ $full -eq 1 ] && [ "$limit" -lt 20 ]; then
  add "GPT-2 tessera (cuda, bf16)" "not run: time budget spent"
elif [ $full -eq 1 ]; then
  say "gpu_check: tessera train, GPT-2 124M and 350M bf16 on cuda (at most $limit s)"
  out=$(PYTHONUNBUFFERED=1 timeout "$limit" "$python" "$root/scripts/bench/gpt2_tessera_cuda.py" --tessera "$tessera_bin" \
        --workdir "$build/gpt2_bench" --deadline $(( limit - 10 )) "${gpt_args[@]}" 2>&1)
  rc=$?
  echo "$out" | tee -a "$log"
  gpt_out+="$out"$'\n'
  notrun=$(echo "$out" | sed -n 's/^NOTRUN tessera //p' | head -1)
  if [ -n "$notrun" ]; then add "GPT-2 tessera (cuda, bf16)" "not run: $notrun"
  elif [ $rc -eq 124 ]; then add "GPT-2 tessera (cuda, bf16)" "TIMED OUT after $limit s (rows below: what finished)"; failed_any=1
  elif [ $rc -ne 0 ]; then add "GPT-2 tessera (cuda, bf16)" "FAILED (rc $rc, see $log)"; failed_any=1
  else
    n_ok=$(echo "$out" | grep -c '^RESULT tessera .* ok$')
    n_all=$(echo "$out" | grep -c '^RESULT tessera ')
    [ "$n_ok" -eq 0 ] && failed_any=1
    add "GPT-2 tessera (cuda, bf16)" "$([ "$n_ok" -eq 0 ] && echo FAILED || echo ok): $n_ok of $n_all runs ok"
  fi
else
  add "GPT-2 tessera (cuda, bf16)" "not run: no full build (kernels-only fallback)"
fi
if [ $torch_cuda -eq 1 ]; then
  for mode in eager compile; do
    [ $mode = eager ] && limit=$(stage_limit 50 40) || limit=$(stage_limit 150 0)
    if [ "$limit" -lt 20 ]; then add "GPT-2 torch $mode" "not run: time budget spent"; continue; fi
    out=$(LD_LIBRARY_PATH=$python_env_ld PYTHONUNBUFFERED=1 timeout "$limit" "$python" "$root/scripts/bench/gpt2_torch_cuda.py" \
          --device cuda --mode $mode --deadline $(( limit - 5 )) "${gpt_args[@]}" 2>&1)
    rc=$?
    echo "$out" | tee -a "$log"
    gpt_out+="$out"$'\n'
    if [ $rc -eq 124 ]; then add "GPT-2 torch $mode" "TIMED OUT after $limit s (rows below: what finished)"
    elif [ $rc -ne 0 ]; then add "GPT-2 torch $mode" "FAILED (rc $rc, see $log)"
    else add "GPT-2 torch $mode" "ok ($(echo "$out" | grep -c "^RESULT torch-$mode .* ok$") runs; $(echo "$out" | sed -n 's/^INFO //p' | head -1))"; fi
  done
else
  add "GPT-2 torch" "not run: torch with CUDA not available to $python"
fi
table=$(echo "$gpt_out" | awk '$1 == "RESULT" {
  printf "| %-14s | %-9s | %3s | %10s | %6s | %8s | %8s | %s\n", $2, $3, $4, $6, $7, $8, $9, $10 }')
tables+=("$(printf '%s\n%s\n%s' "== GPT-2, bf16, T 1024, one GPU: tokens/s, MFU against $peak TFLOP/s, peak memory ==" \
  "| impl           | model     |   B |   tokens/s |  MFU % | peak GiB |  ms/step | status" "$table")")
prof=$(echo "$gpt_out" | sed -n '/^PROFILE /,/^END PROFILE/p')
[ -n "$prof" ] && tables+=("== tessera: time per op family (ms/step, rank 0's profiler; a separate train.profile run that synchronizes per family: read the shares) ==
$prof")

build_rest
add "GPU verified" "yes: the gpu tests and benchmarks above ran on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
finish $failed_any

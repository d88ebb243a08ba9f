#!/usr/bin/env bash
# Rehearses scripts/gpu_check.sh here, on a machine without a GPU, as close as this machine allows
# to the GPU machine, which has none of the Debian packages the build needs (docs/cuda.md,
# "gpu_check.sh"): in a private mount namespace (unshare -m, root) /usr becomes an overlay from
# which every file of every package of .gpu-deps/ installed here is removed (nothing changes
# outside the namespace), except the packages this machine's own tools (cmake, gcc, nvcc, ninja,
# ccache, python3, dpkg) load: those stay, are listed, and the check below shows that the built
# programs load the prefix's copies anyway (their RPATH comes first). Then, in the namespace:
#   TESSERA_GPU_DEPS=debs scripts/gpu_check.sh     (expected: exit 3, "nothing was verified")
# and a check of what the build used: the dependency paths in CMakeCache.txt and `ldd` of the
# built programs must name the prefix, never /usr; then the tessera side of the GPT-2 stage on the
# CPU (a tiny model) and with train.device = "cuda" (reported not run).
#   scripts/gpu_check_rehearse.sh       (needs root and unshare; runs scripts/gpu_deps.sh if .gpu-deps is missing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ "$(id -u)" -eq 0 ] || { echo "gpu_check_rehearse: needs root (unshare -m, mount -t overlay)" >&2; exit 1; }
ls .gpu-deps/*.deb >/dev/null 2>&1 || scripts/gpu_deps.sh
multiarch=x86_64-linux-gnu

# Packages whose libraries the tools of the rehearsal load: they cannot be hidden.
keep=$(for t in cmake ninja gcc g++ nvcc ccache python3 dpkg readelf ld ctest; do
         p=$(command -v $t) && { ldd "$p" 2>/dev/null || true; } | awk '/=> \//{print $3}'
       done | sort -u | while read -r f; do
         b=$(basename "$f")
         { dpkg -S "/usr/lib/$multiarch/$b" "/lib/$multiarch/$b" 2>/dev/null || true; } | cut -d: -f1 | head -1
       done | sort -u)
hide=()
kept=()
for d in .gpu-deps/*.deb; do
  p=$(dpkg-deb -f "$d" Package)
  dpkg-query -W -f='${Status}' "$p:amd64" 2>/dev/null | grep -q "install ok installed" ||
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || continue
  if echo "$keep" | grep -qx "$p"; then kept+=("$p"); else hide+=("$p"); fi
done
echo "gpu_check_rehearse: hiding ${#hide[@]} installed packages: ${hide[*]}"
echo "gpu_check_rehearse: kept (the rehearsal's own tools load them): ${kept[*]:-none}"

ov=$(mktemp -d /tmp/gpu-rehearse.XXXXXX)
mkdir -p "$ov/up" "$ov/work"
export ov root multiarch
# The GPU machine has no ccache: build cold (REHEARSE_CCACHE=1 keeps it), with time for 2 cores.
[ "${REHEARSE_CCACHE:-0}" = 1 ] || export CCACHE_DISABLE=1
export TESSERA_GPU_BUDGET=${TESSERA_GPU_BUDGET:-10800} TESSERA_GPU_TIME_SCALE=${TESSERA_GPU_TIME_SCALE:-30}
export HIDE="${hide[*]}"
unshare -m bash -c '
  set -uo pipefail
  mount --make-rprivate / 2>/dev/null
  mount -t overlay overlay -o lowerdir=/usr,upperdir=$ov/up,workdir=$ov/work /usr || exit 1
  n=0
  for p in $HIDE; do
    while IFS= read -r f; do
      f=${f/#\/lib\//\/usr\/lib\/}
      if [ -f "$f" ] || [ -L "$f" ]; then rm -f "$f" && n=$((n + 1)); fi
    done < <(dpkg -L "$p" 2>/dev/null)
  done
  echo "gpu_check_rehearse: $n files hidden, e.g. /usr/include/$multiarch/mpich/mpi.h: $(ls /usr/include/$multiarch/mpich/mpi.h 2>&1 | tail -1)"
  cd "$root"
  TESSERA_GPU_DEPS=debs scripts/gpu_check.sh
  rc=$?
  echo "gpu_check_rehearse: gpu_check.sh exited $rc"
  build=${TESSERA_GPU_BUILD:-$root/build-gpu}
  echo "== dependency paths in $build/CMakeCache.txt =="
  grep -E "^(MPI_C_(HEADER_DIR|LIB_NAMES|COMPILER)|MPI_mpi_LIBRARY|MPIEXEC_EXECUTABLE|HDF5_C_(INCLUDE_DIR|LIBRARY_hdf5)|HDF5_IS_PARALLEL|PNG_LIBRARY_RELEASE|PNG_PNG_INCLUDE_DIR|JPEG_LIBRARY_RELEASE|JPEG_INCLUDE_DIR|ZLIB_LIBRARY_RELEASE|ZLIB_INCLUDE_DIR|CLI11_DIR|tomlplusplus_DIR|GTest_DIR|BLAS_LIBRARY|CBLAS_INCLUDE_DIR)[:=]" \
    "$build/CMakeCache.txt" 2>/dev/null
  # glibc (libm, libdl) comes from the system everywhere; h5diff (FindHDF5 looks for it) is used by nothing.
  bad=$(grep -E "^(MPI|HDF5|PNG|JPEG|ZLIB|CLI11|tomlplusplus|GTest|BLAS|CBLAS)[A-Za-z_]*:[A-Z]+=/usr/" "$build/CMakeCache.txt" 2>/dev/null |
        grep -vE "^HDF5_C_LIBRARY_(m|dl|rt|pthread):|^HDF5_DIFF_EXECUTABLE:")
  echo "== libraries of the built programs (ldd), prefix packages only =="
  for exe in "$build/tessera" "$build/tests/tests_gpu" "$build/tests/tests_app" "$build/bench/attention_cuda_bench"; do
    [ -x "$exe" ] || continue
    echo "$exe:"
    ldd "$exe" | grep -E "mpich|hdf5|toml|png|jpeg|openblas|gfortran|libz\.|curl|hwloc|ucx|ucp|ucs|not found" | sed "s/^/  /"
    bad+=$(ldd "$exe" | grep -E "not found|=> /(usr/)?lib/$multiarch/lib(mpich|hdf5|tomlplusplus|png|jpeg|openblas|gfortran|z\.|curl|hwloc|uc[pst])" || true)
  done
  if [ -n "$bad" ]; then echo "gpu_check_rehearse: SYSTEM PATHS OR MISSING LIBRARIES:"; echo "$bad"; exit 1; fi
  echo "gpu_check_rehearse: every dependency came from the prefix"
  # The GPT-2 stage without a GPU, still in the namespace: the tessera driver on the CPU (tiny
  # model: rows, MFU, memory, the profile table), then with train.device = "cuda" (NOTRUN row).
  if [ -x "$build/tessera" ]; then
    python3 scripts/bench/gpt2_tessera_cuda.py --tessera "$build/tessera" --workdir /tmp/gpu-rehearse-gpt2 \
      --device cpu --tiny --steps 4 --warmup 1 --deadline 120 || rc=1
    python3 scripts/bench/gpt2_tessera_cuda.py --tessera "$build/tessera" --workdir /tmp/gpu-rehearse-gpt2 \
      --tiny --deadline 60 || rc=1
  fi
  exit $rc
'
rc=$?
rm -rf "$ov"
exit $rc

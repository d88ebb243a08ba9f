#!/usr/bin/env bash
# Fetches, on a machine with Debian's package registry, the .deb files that scripts/gpu_check.sh
# unpacks (dpkg -x, into a prefix under /tmp) on a GPU machine that has nvcc, CMake, ninja and
# Python but none of Debian's -dev packages and no network: everything the FULL build links
# (docs/cuda.md, "gpu_check.sh"):
#   MPICH (headers, libmpich, mpiexec.hydra), parallel HDF5 (libhdf5-mpich), toml++, CLI11, nlohmann/json,
#   libpng, libjpeg, zlib, the OpenMP build of OpenBLAS, GoogleTest,
# and then the runtime libraries those need, found by following the ELF NEEDED entries of every
# unpacked library and program to the package that provides the soname here (dpkg -S), until
# nothing is missing but glibc, libstdc++, libgcc_s and libgomp (the host compiler's own, present
# wherever nvcc can compile). Plugins loaded at run time (UCX's transports under ucx/) are not
# followed: MPICH runs without them on one node.
# They land in .gpu-deps/ (git-ignored: binaries are never committed); carry that folder to the
# GPU machine with the working tree (the device tool carries at most 64 MiB in all). The list of
# packages, with the reason each is there, goes to .gpu-deps/PACKAGES.
#   scripts/gpu_deps.sh            (then, there: scripts/gpu_check.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.gpu-deps
multiarch=x86_64-linux-gnu
# What the build names (CMakeLists.txt, data/CMakeLists.txt, tests/CMakeLists.txt).
seeds=(
  libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0   # BLAS (OpenMP build)
  libgtest-dev                                                           # GoogleTest (static)
  mpich libmpich12 libmpich-dev                                          # MPI: mpiexec.hydra, libmpich
  libhdf5-mpich-103-1 libhdf5-mpich-hl-100 libhdf5-mpich-dev             # parallel HDF5 (h5pcc links hl)
  libtomlplusplus3 libtomlplusplus-dev libcli11-dev                      # config, command line
  nlohmann-json3-dev                                                     # JSON (header-only)
  libpng16-16 libpng-dev libjpeg62-turbo libjpeg62-turbo-dev             # image decoding (data/)
  zlib1g zlib1g-dev                                                      # libpng's FindPNG needs ZLIB
)
# Sonames every Linux with a C++ compiler has: never fetched.
base_sonames='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libgomp)\.so'

mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb PACKAGES
download() {
  apt-get download "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get download "$@"; }
}
download "${seeds[@]}"
for p in "${seeds[@]}"; do echo "$p  (named by the build)" >>PACKAGES; done

# Follow NEEDED until closed.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for round in 1 2 3 4 5 6 7 8; do
  rm -rf "$stage/p" && mkdir -p "$stage/p"
  for d in ./*.deb; do dpkg -x "$d" "$stage/p"; done
  provided=$(find "$stage/p" -name '*.so*' \( -type f -o -type l \) -printf '%f\n' | sort -u)
  needed=$(find "$stage/p" -type f \( -name '*.so*' -o -path '*/bin/*' \) -not -path '*/ucx/*' -print0 |
           { xargs -0 readelf -d 2>/dev/null || true; } | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
  missing=$(comm -23 <(echo "$needed") <(echo "$provided") | grep -Ev "$base_sonames" || true)
  [ -z "$missing" ] && break
  new=()
  for so in $missing; do
    pkg=$(dpkg -S "/usr/lib/$multiarch/$so" "/lib/$multiarch/$so" 2>/dev/null | head -1 | cut -d: -f1) || true
    if [ -z "$pkg" ]; then echo "gpu_deps: no installed package here provides $so (needed by the unpacked tree)" >&2; exit 1; fi
    if ! grep -q "^$pkg " PACKAGES && [[ " ${new[*]} " != *" $pkg "* ]]; then
      new+=("$pkg")
      echo "$pkg  (provides $so)" >>PACKAGES
    fi
  done
  [ ${#new[@]} -eq 0 ] && break
  download "${new[@]}"
done
echo "gpu_deps: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dest (list: $dest/PACKAGES)"

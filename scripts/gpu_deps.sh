#!/usr/bin/env bash
# Fetches, on a machine with Debian's package registry, the .deb files that scripts/gpu_check.sh
# unpacks (dpkg -x, into a prefix under /tmp) on a GPU machine that has nvcc, CMake, ninja and
# Python but none of Debian's -dev packages and no network: the OpenMP build of OpenBLAS (the CPU
# attention the GPU tests compare against uses it), its Fortran runtime, and GoogleTest.
# They land in .gpu-deps/ (git-ignored: binaries are never committed); carry that folder to the
# GPU machine with the working tree. About 10 MB.
#   scripts/gpu_deps.sh            (then, there: scripts/gpu_check.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.gpu-deps
packages=(libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0 libgtest-dev)
mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb
if ! apt-get download "${packages[@]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null
  apt-get download "${packages[@]}"
fi
ls -l "$dest"

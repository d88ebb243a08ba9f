#!/usr/bin/env bash
# Installs every package tessera needs (Debian 12) and builds Release into build/.
# Idempotent and non-interactive: safe to run again. Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config git
  mpich libmpich-dev                # MPI
  libhdf5-mpich-dev hdf5-tools      # parallel HDF5 (checkpoints, fixtures)
  libcli11-dev libtomlplusplus-dev  # command line, config
  nlohmann-json3-dev                # JSON (encoder.json, .jsonl, Hugging Face config.json, safetensors headers)
  libgtest-dev                      # tests
  libopenblas-openmp-dev libblis-dev  # CPU GEMM: OpenBLAS (OpenMP build) is used; BLIS for comparison
  libdnnl-dev                       # bf16 GEMM (train.dtype = "bf16"): oneDNN's matmul
  libpng-dev libjpeg62-turbo-dev    # image files (tessera prepare --images, generate --image)
  python3-numpy python3-h5py python3-matplotlib  # scripts (plots, fixture checks)
  python3-pil python3-sklearn       # the image tests' PIL oracle; the digits set (scripts/data/prepare_digits.py)
  slurm-wlm munge                   # the `slurm` tests start a one-node cluster of their own
  time                              # /usr/bin/time: the import test's peak-memory measure
)
if [ "${TESSERA_SETUP_TORCH:-0}" = 1 ]; then
  packages+=(python3-torch)  # only to regenerate golden fixtures / run the PyTorch benchmark
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
echo "setup: built build/tessera"

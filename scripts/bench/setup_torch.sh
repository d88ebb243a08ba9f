#!/usr/bin/env bash
# Creates the PyTorch venv the side-by-side benchmark (scripts/bench/train_bench.py) compares
# against. Benchmarks only: the build, the tests and CI never need it.
#
#   scripts/bench/setup_torch.sh [VENV_DIR] [TORCH_SPEC]    # defaults: /work/bench-venv, torch
#
# PyPI's default Linux x86_64 wheel is the CUDA build and pulls the nvidia-* packages (several GiB);
# the CPU-only index (download.pytorch.org/whl/cpu) is used instead when TORCH_INDEX_URL names it
# and it is reachable. The CPU code path is the same either way.
set -euo pipefail

venv=${1:-/work/bench-venv}
spec=${2:-torch}
python=${PYTHON:-python3}

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade pip
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
  "$venv/bin/python" -m pip install --index-url "$TORCH_INDEX_URL" "$spec"
else
  "$venv/bin/python" -m pip install "$spec"
fi
"$venv/bin/python" -m pip install numpy
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'

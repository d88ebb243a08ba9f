#!/usr/bin/env bash
# Runs the whole test suite (CTest) against the build in build/. Extra args go to ctest,
# e.g. scripts/test.sh -R Gelu   or   scripts/test.sh -L kernels
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"

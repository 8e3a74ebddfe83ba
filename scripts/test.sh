#!/usr/bin/env bash
# The whole test suite (README, second command): set up and build, then run every test with
# ctest. CUDA tests are built when nvcc exists and skip at run time without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh all
build_dir=${DSV41_BUILD_DIR:-build}
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" "$@"

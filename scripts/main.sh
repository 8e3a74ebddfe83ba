#!/usr/bin/env bash
# The main job (README, first command): set up and build, then run dsv41 on the built-in tiny
# and released configs. Exit code: that of the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
build_dir=${DSV41_BUILD_DIR:-build}
"$build_dir/dsv41" selfcheck
"$build_dir/dsv41" bytes --config full
"$build_dir/dsv41" bytes --config tiny
# The reference forward on the tiny config with the official oracle weights: a 64-token prompt
# (ids 1, 3, ..., 127), then 4 decode steps; prints where the HDF5 output went.
"$build_dir/dsv41" forward --config tiny --weights golden/oracle/weights.safetensors \
  --prompt "$(seq -s, 1 2 127)" --decode 5,723,380,584 -o "$build_dir/main-forward.h5"

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

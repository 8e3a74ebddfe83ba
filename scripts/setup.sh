#!/usr/bin/env bash
# Installs dsv41's build dependencies (Debian 12 packages) if they are missing, then configures
# and builds the project in ./build. Idempotent: a second run installs nothing and rebuilds only
# what changed. Environment:
#   DSV41_BUILD_DIR  build folder (default: build)
#   DSV41_WERROR     ON to treat warnings as errors (default: ON under CI, else OFF)
#   DSV41_CMAKE_ARGS extra arguments for cmake (e.g. -DDSV41_ENABLE_CUDA=OFF)
set -euo pipefail
cd "$(dirname "$0")/.."

# node-d3: the plotting library the HTML report embeds (docs/report-html.md); chromium,
# fonts-dejavu-core and python3-websocket: the report's browser test (ReportHtml.*).
packages=(build-essential cmake ninja-build git pkg-config
          libeigen3-dev libboost-dev libhdf5-dev hdf5-tools libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev librapidcheck-dev
          python3 python3-h5py python3-numpy python3-pandas
          node-d3 chromium fonts-dejavu-core python3-websocket)
./scripts/apt_install.sh "${packages[@]}"

build_dir=${DSV41_BUILD_DIR:-build}
werror=${DSV41_WERROR:-$([ "${CI:-}" = true ] && echo ON || echo OFF)}
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_WERROR="$werror" \
  ${DSV41_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

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
          libgtest-dev libgmock-dev librapidcheck-dev libopenmpi-dev openmpi-bin  # MPI: dsv41 sweep
          python3 python3-h5py python3-numpy python3-pandas
          pybind11-dev python3-dev python3-pybind11 python3-pytest  # the dsv41 Python module (python/)
          python3-torch                                             # its example port (examples/torch_port)
          node-d3 chromium fonts-dejavu-core python3-websocket)     # report html and its browser test
./scripts/apt_install.sh "${packages[@]}"

build_dir=${DSV41_BUILD_DIR:-build}
werror=${DSV41_WERROR:-$([ "${CI:-}" = true ] && echo ON || echo OFF)}
# ccache when the machine has it (not installed here: CI's fresh machine compiles everything).
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_WERROR="$werror" \
  "${launcher[@]}" ${DSV41_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

# `import dsv41` without a PYTHONPATH: a .pth file in the site-packages of the interpreter the
# module is built for (Debian's /usr/bin/python3) names this checkout's build/python (the system
# site folder as root, the user's otherwise). PYTHONPATH, when set, still comes first.
if [ -d "$build_dir/python/dsv41" ]; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if [ "$(id -u)" -eq 0 ]; then
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  else
    site=$("$py" -m site --user-site)
  fi
  mkdir -p "$site"
  echo "$(cd "$build_dir/python" && pwd)" > "$site/dsv41-build.pth"
fi

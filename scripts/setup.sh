#!/usr/bin/env bash
# scripts/setup.sh [main|all]: installs dsv41's build dependencies (Debian 12 packages) if they are
# missing, then configures and builds the project in ./build. Idempotent: a second run installs
# nothing and rebuilds only what changed.
#   main  what the main job runs (README, first command): the build and report packages only, and
#         only the `dsv41` executable (no tests, no Python module); the CUDA path only where a GPU
#         is present (nvidia-smi lists one), since only there can the `cuda` backend run
#   all   (default) everything: the test suite's packages too (GoogleTest, rapidcheck, h5py, torch,
#         Chromium for the HTML report's browser test), every target, the Python module, and the
#         CUDA path wherever nvcc exists (its tests skip at run time without a GPU)
# Each profile states every build option it depends on, so one ./build serves both in turn.
# Environment:
#   DSV41_BUILD_DIR  build folder (default: build)
#   DSV41_WERROR     ON to treat warnings as errors (default: ON under CI, else OFF)
#   DSV41_CMAKE_ARGS extra arguments for cmake (e.g. -DDSV41_ENABLE_CUDA=OFF; they come last and win)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-all}

# Main: the compilers, CMake, and the libraries the dsv41 executable links; node-d3 is the
# plotting library the HTML report embeds (docs/report-html.md).
packages=(build-essential cmake ninja-build git pkg-config
          libeigen3-dev libboost-dev libhdf5-dev libcli11-dev nlohmann-json3-dev
          libopenmpi-dev openmpi-bin   # MPI: dsv41 sweep
          python3 node-d3)
case "$profile" in
  main) ;;
  all)
    packages+=(hdf5-tools libgtest-dev libgmock-dev librapidcheck-dev
               python3-h5py python3-numpy python3-pandas
               pybind11-dev python3-dev python3-pybind11 python3-pytest  # the dsv41 Python module (python/)
               python3-torch                                             # its example port (examples/torch_port)
               python3-venv python3-setuptools python3-pip dpkg-dev      # tests/install: pip install in a venv, the .deb
               chromium fonts-dejavu-core python3-websocket)             # the HTML report's browser test
    ;;
  *) echo "setup.sh: unknown profile '$profile' (main or all)" >&2; exit 2 ;;
esac
./scripts/apt_install.sh "${packages[@]}"

build_dir=${DSV41_BUILD_DIR:-build}
werror=${DSV41_WERROR:-$([ "${CI:-}" = true ] && echo ON || echo OFF)}
if [ "$profile" = main ]; then
  cuda=OFF
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
  options=(-DDSV41_BUILD_TESTS=OFF -DDSV41_PYTHON=OFF -DDSV41_ENABLE_CUDA="$cuda")
  targets=(--target dsv41)
else
  options=(-DDSV41_BUILD_TESTS=ON -DDSV41_PYTHON=ON -DDSV41_ENABLE_CUDA=ON)
  targets=()
fi
# ccache when the machine has it (not installed here: CI's fresh machine compiles everything).
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_WERROR="$werror" \
  "${options[@]}" "${launcher[@]}" ${DSV41_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"

# `import dsv41` without a PYTHONPATH: a .pth file in the site-packages of the interpreter the
# module is built for (Debian's /usr/bin/python3) names this checkout's build/python (the system
# site folder as root, the user's otherwise). PYTHONPATH, when set, still comes first.
if [ "$profile" = all ] && [ -d "$build_dir/python/dsv41" ]; then
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

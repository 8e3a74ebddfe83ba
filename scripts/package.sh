#!/usr/bin/env bash
# scripts/package.sh [BUILD_DIR]: the .deb of dsv41 (docs/install.md) from a configured and built
# build folder (default: build, the test build of scripts/test.sh): CPack runs the install rules
# (scripts/install.cmake) into a staging folder under prefix /usr and packs it, with the shared
# libraries' dependencies from dpkg-shlibdeps (Debian's dpkg-dev). Prints the .deb's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/CPackConfig.cmake" ] || { echo "package.sh: $build is not a configured dsv41 build (run scripts/setup.sh first)" >&2; exit 2; }
command -v dpkg-shlibdeps > /dev/null || { echo "package.sh: dpkg-shlibdeps is missing (apt-get install dpkg-dev)" >&2; exit 2; }
cmake --build "$build" --target dsv41 $(grep -q '^DSV41_PYTHON:BOOL=ON' "$build/CMakeCache.txt" && echo dsv41_python) dsv41_formats
(cd "$build" && cpack -G DEB > cpack.log 2>&1) || { tail -30 "$build/cpack.log" >&2; exit 1; }
deb=$(ls -t "$build"/dsv41_*.deb | head -1)
echo "$deb"

#!/usr/bin/env bash
# bench/decode_curve.sh: the decode-cost curve (issue 32, item 5; bench/decode_curve.cc) in one call:
# builds dsv41_decode_curve (into build/, configured as scripts/gpu_check.sh does; CUDA required for
# a cuda backend) and runs it at contexts 4096,16384,65536,262144,1048576 on BACKEND, from synthetic
# states (no prefill). Output in $OUT (default ./bench_out): decode_curve_<backend>.log (header,
# build tail on failure, the table), decode_curve_<backend>.csv and .json (rewritten atomically
# after every context: a run cut short keeps the contexts it finished). The run itself is bounded by
# DSV41_CURVE_TIMEOUT seconds (default 480: one `run` call is 600 s with the build).
# Usage: [OUT=DIR] [DSV41_CMAKE_ARGS=...] [DSV41_CURVE_CONTEXTS=4096,...] bench/decode_curve.sh BACKEND [dsv41_decode_curve args]
#   BACKEND: cuda (the production path), cuda-exact, ref (CPU: slow beyond 64K), ref-order:<variant>
#   e.g. bench/decode_curve.sh cuda --config scenarios/configs/million.json --steps 50
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bench/decode_curve.sh BACKEND [dsv41_decode_curve args]  (BACKEND: cuda, cuda-exact, ref, ref-order:<variant>)" >&2
  exit 2
fi
backend=$1
shift
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
tag=${backend//[^A-Za-z0-9_-]/_}
LOG=$OUT/decode_curve_$tag.log
{
  echo "== commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "== $(date -u +%FT%TZ) $(nproc) cores"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} > "$LOG"
require_cuda=""
[[ "$backend" == cuda* ]] && require_cuda="-DDSV41_REQUIRE_CUDA=ON"
t0=$(date +%s)
# shellcheck disable=SC2086
{ [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $require_cuda ${DSV41_CMAKE_ARGS:-}; } \
  > "$OUT/decode_curve_build.log" 2>&1
if ! cmake --build build -j"$(nproc)" --target dsv41_decode_curve >> "$OUT/decode_curve_build.log" 2>&1; then
  { echo "build failed"; tail -30 "$OUT/decode_curve_build.log"; } >> "$LOG"
  cat "$LOG"
  exit 1
fi
echo "== build $(( $(date +%s) - t0 )) s" >> "$LOG"
timeout "${DSV41_CURVE_TIMEOUT:-480}" ./build/bench/dsv41_decode_curve --backend "$backend" \
  --contexts "${DSV41_CURVE_CONTEXTS:-4096,16384,65536,262144,1048576}" --out "$OUT/decode_curve_$tag" "$@" >> "$LOG" 2>&1
rc=$?
[[ $rc -eq 124 ]] && echo "== timed out after ${DSV41_CURVE_TIMEOUT:-480} s: the CSV/JSON hold the contexts that finished" >> "$LOG"
cat "$LOG"
exit $rc

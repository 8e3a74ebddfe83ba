#!/usr/bin/env bash
# bench/index_select.sh: the production fused indexer (backend `cuda`, cuda/index_select.cu) at the
# released index dims beside the exact twin's unfused kernels and torch eager
# (bench/index_select_torch.py), on a GPU machine in one call. Builds dsv41_index_select_bench (into
# build/, configured as scripts/gpu_check.sh does), runs torch first and the kernels after (never at
# the same time). Output: $OUT/index_select.log.
# Usage: [DSV41_CMAKE_ARGS=...] [TORCH_ARGS=--long] bench/index_select.sh [dsv41_index_select_bench args]
#   e.g. bench/index_select.sh --splits 8192:4,4096:2,2048:1   (old = the default split, new = the
#   pipelined loop / fit_wave / other splits, each line checked for the same picks)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
LOG=$OUT/index_select.log
{
  echo "== commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} > "$LOG"
# shellcheck disable=SC2086
{ [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-}; } \
  > "$OUT/index_select_build.log" 2>&1
cmake --build build -j"$(nproc)" --target dsv41_index_select_bench >> "$OUT/index_select_build.log" 2>&1 \
  || { echo "build failed" >> "$LOG"; tail -20 "$OUT/index_select_build.log"; exit 1; }
# shellcheck disable=SC2086
python3 bench/index_select_torch.py ${TORCH_ARGS:-} >> "$LOG" 2>&1
./build/bench/dsv41_index_select_bench "$@" >> "$LOG" 2>&1
rc=$?
cat "$LOG"
exit $rc

#!/usr/bin/env bash
# bench/fp8_linear.sh: the production fp8 linear's GEMM kernels (backend `cuda`: the serial wgmma
# kernel cuda/linear_fp8_wgmma.cu, the pipelined one cuda/linear_fp8_wgmma_pipe.cu (cp.async and
# TMA code loads) and the warp-specialized one cuda/linear_fp8_wgmma_ws.cu; FP8_KERNELS picks, e.g.
# serial,pipelined,pipelined_tma,ws,mma_sync) at
# released-class shapes beside torch eager (bench/fp8_linear_torch.py), on a GPU machine in one call.
# Builds dsv41_fp8_linear_bench (into build/, configured as scripts/gpu_check.sh does), then runs
# torch first and the kernels after (never at the same time). Output: $OUT/fp8_linear.log.
# Usage: [DSV41_CMAKE_ARGS=...] [FP8_KERNELS=serial,pipelined,pipelined_tma] [FP8_BUDGET_MS=2000] \
#          bench/fp8_linear.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
LOG=$OUT/fp8_linear.log
{
  echo "== commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} > "$LOG"
# shellcheck disable=SC2086
{ [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-}; } \
  > "$OUT/fp8_build.log" 2>&1
cmake --build build -j"$(nproc)" --target dsv41_fp8_linear_bench >> "$OUT/fp8_build.log" 2>&1 || { echo "build failed" >> "$LOG"; tail -20 "$OUT/fp8_build.log"; exit 1; }
python3 bench/fp8_linear_torch.py >> "$LOG" 2>&1
./build/bench/dsv41_fp8_linear_bench --kernels "${FP8_KERNELS:-serial,pipelined,pipelined_tma}" --budget-ms "${FP8_BUDGET_MS:-2000}" \
  >> "$LOG" 2>&1
rc=$?
cat "$LOG"
exit $rc

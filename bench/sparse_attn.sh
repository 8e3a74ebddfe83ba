#!/usr/bin/env bash
# bench/sparse_attn.sh: the production sparse attention (backend `cuda`, cuda/attention_wgmma.cu) at
# issue 32's shapes beside torch eager and the bf16 matmul peak (bench/sparse_attn_torch.py), on a
# GPU machine in one call. Builds dsv41_sparse_attn_bench (into build/, configured as
# scripts/gpu_check.sh does), runs torch first and the kernels after (never at the same time), the
# kernel's % of peak against the peak measured here. Output: $OUT/sparse_attn.log.
# Usage: [DSV41_CMAKE_ARGS=...] bench/sparse_attn.sh [--exact]   (--exact: the exact stages too)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
LOG=$OUT/sparse_attn.log
{
  echo "== commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} > "$LOG"
# shellcheck disable=SC2086
{ [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-}; } \
  > "$OUT/sparse_attn_build.log" 2>&1
cmake --build build -j"$(nproc)" --target dsv41_sparse_attn_bench >> "$OUT/sparse_attn_build.log" 2>&1 \
  || { echo "build failed" >> "$LOG"; tail -20 "$OUT/sparse_attn_build.log"; exit 1; }
python3 bench/sparse_attn_torch.py >> "$LOG" 2>&1
peak=$(grep -o '[0-9.]* TFLOP/s (peak)' "$LOG" | head -1 | cut -d' ' -f1)
./build/bench/dsv41_sparse_attn_bench ${peak:+--peak $peak} "$@" >> "$LOG" 2>&1
rc=$?
cat "$LOG"
exit $rc

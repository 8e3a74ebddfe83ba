#!/usr/bin/env bash
# bench/run.sh: the one benchmark command of issue 17 (deliverable 1), plus the determinism test of
# deliverable 4, on a GPU machine (the `run` tool's H200) in one call.
#   1. configure (CUDA required) and build only dsv41_kernels_bench and cuda_determinism_test;
#      meanwhile bench/torch_eager.py times the torch eager equivalents (pinned to 2 cores, the
#      build to the others, so the build never competes with torch's launches)
#   2. dsv41_kernels_bench: every cuda/ kernel at the issue's shapes and a decode shape each, each
#      checked bit for bit against the reference op before its time is printed, side by side with
#      torch (speed-up column) -> $OUT/bench.md (paste into bench/RESULTS.md)
#   3. cuda_determinism_test (same bits run to run and for any interleaving of sessions)
# Writes to $OUT (default ./bench_out): bench.md, bench.log (kernel bench + torch + summary),
# build.log (configure + build), determinism.log. Exit status 0 when everything passed.
# Usage: [DSV41_CMAKE_ARGS=...] [BENCH_BUDGET_MS=3000] bench/run.sh
# The lent H200 lacks nlohmann-json: scripts/device_tree.sh slim stages it in .devdeps (carry it and
# pass DSV41_CMAKE_ARGS=-DCMAKE_PREFIX_PATH=$PWD/.devdeps).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
LOG=$OUT/bench.log
NCPU=$(nproc)
status=0
t0=$(date +%s)
{
  echo "== commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
  echo "== $(nvcc --version 2>/dev/null | tail -1); $NCPU cores"
} > "$LOG"

# torch eager, in the background on cores 0-1 (when torch is importable)
TORCH=$OUT/torch.txt
rm -f "$TORCH"
torch_pid=
if python3 -c "import torch" 2> /dev/null; then
  taskset -c 0-1 python3 bench/torch_eager.py "$TORCH" --budget-ms 2000 > "$OUT/torch.log" 2>&1 &
  torch_pid=$!
else
  echo "torch: not importable, no torch column" >> "$LOG"
fi

CORES="2-$((NCPU - 1))"
[ "$NCPU" -le 2 ] && CORES="0-$((NCPU - 1))"
# shellcheck disable=SC2086
{ taskset -c "$CORES" cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-} \
  && taskset -c "$CORES" cmake --build build -j"$((NCPU > 2 ? NCPU - 2 : NCPU))" \
       --target dsv41_kernels_bench cuda_determinism_test; } > "$OUT/build.log" 2>&1
build_rc=$?
tb=$(date +%s)
echo "== build rc $build_rc in $((tb - t0)) s" >> "$LOG"

if [ -n "$torch_pid" ]; then
  wait "$torch_pid"; echo "== torch eager rc $? at $(($(date +%s) - t0)) s" >> "$LOG"
  cat "$OUT/torch.log" >> "$LOG"; rm -f "$OUT/torch.log"
fi

if [ "$build_rc" -eq 0 ]; then
  timeout 330 ./build/bench/dsv41_kernels_bench --torch "$TORCH" --md "$OUT/bench.md" \
      --budget-ms "${BENCH_BUDGET_MS:-3000}" >> "$LOG" 2>&1
  rc=$?; echo "== kernels bench rc $rc at $(($(date +%s) - t0)) s" >> "$LOG"; [ $rc -eq 0 ] || status=1
  timeout 150 ./build/tests/cuda/cuda_determinism_test > "$OUT/determinism.log" 2>&1
  rc=$?; echo "== determinism test rc $rc at $(($(date +%s) - t0)) s" >> "$LOG"; [ $rc -eq 0 ] || status=1
  # across processes: a second process must print the same hash of session A's bits
  timeout 60 ./build/tests/cuda/cuda_determinism_test --gtest_filter='*RunToRun' > "$OUT/determinism2.tmp" 2>&1
  h1=$(grep -o 'fnv1a64=[0-9a-f]*' "$OUT/determinism.log"); h2=$(grep -o 'fnv1a64=[0-9a-f]*' "$OUT/determinism2.tmp")
  if [ -n "$h1" ] && [ "$h1" = "$h2" ]; then echo "== determinism across processes: same ($h1)" >> "$LOG"
  else echo "== determinism across processes: DIFFERENT or missing ('$h1' vs '$h2')" >> "$LOG"; status=1; fi
  rm -f "$OUT/determinism2.tmp"
else
  status=1
  tail -n 40 "$OUT/build.log" >> "$LOG"
fi
[ -f "$TORCH" ] && { echo "== torch.txt"; cat "$TORCH"; } >> "$LOG" && rm -f "$TORCH"
grep -E "^\[  (PASSED|FAILED) |^\[  SKIPPED|tests ran" "$OUT/determinism.log" >> "$LOG" 2> /dev/null
cat "$LOG"
exit $status

#!/usr/bin/env bash
# bench/session_batch.sh: one device call that checks and times the three production kernels beside
# their previous variants (issue 32; bench/RESULTS.md "Session 19"): the bit-for-bit and bound tests
# of sparse attention, the fused indexer and the fp8 linear, then their benches with torch eager in
# the same call. Each step has its own time limit so one hang loses only itself.
# Usage: [OUT=DIR] [DSV41_CMAKE_ARGS=...] bench/session_batch.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT"
t0=$(date +%s)
mkdir -p "$OUT/attn" "$OUT/index" "$OUT/linear"
lap() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# shellcheck disable=SC2086
{ [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-}; } > "$OUT/configure.log" 2>&1
cmake --build build -j"$(nproc)" --target cuda_sparse_attn_production_test dsv41_sparse_attn_bench \
  cuda_index_select_production_test dsv41_index_select_bench cuda_linear_production_test dsv41_fp8_linear_bench dsv41 \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
lap build
tests() {  # name binary limit [gtest filter]
  timeout "$3" "./build/tests/cuda/$2" ${4:+--gtest_filter=$4} > "$OUT/$1.log" 2>&1
  echo "$1: rc $? $(grep -c '^\[       OK' "$OUT/$1.log") ok, $(grep -c '^\[  FAILED  \] [A-Z]' "$OUT/$1.log") failed"
  grep -E '^\[  FAILED  \] [A-Z]|Failure' "$OUT/$1.log" | head -6
}
tests attn_test cuda_sparse_attn_production_test 60
tests index_test cuda_index_select_production_test 120
tests linear_test cuda_linear_production_test 120 '-*tma*:*/ws:PipelinedLinearSwitch.*'
tests linear_test_tma cuda_linear_production_test 60 '*tma*:PipelinedLinearSwitch.*'
tests linear_test_ws cuda_linear_production_test 60 '*/ws'
lap tests
OUT=$OUT/attn timeout 90 bench/sparse_attn.sh > /dev/null 2>&1; grep -vE '^\s*$' "$OUT/attn/sparse_attn.log" | tail -24
lap attention
OUT=$OUT/index timeout 100 bench/index_select.sh --splits 8192:4,2048:1 --reps 10 > /dev/null 2>&1
timeout 40 ./build/bench/dsv41_index_select_bench --only long --reps 5 --splits 32768:8 >> "$OUT/index/index_select.log" 2>&1
tail -40 "$OUT/index/index_select.log"
lap index
FP8_KERNELS=serial,pipelined FP8_BUDGET_MS=400 OUT=$OUT/linear timeout 120 bench/fp8_linear.sh > "$OUT/linear/stdout.log" 2>&1
tail -25 "$OUT/linear/stdout.log"
timeout 60 ./build/bench/dsv41_fp8_linear_bench --kernels pipelined,pipelined_tma,ws --budget-ms 400 > "$OUT/linear/tma.log" 2>&1
tail -18 "$OUT/linear/tma.log"
lap linear
# With the time left (one call is 600 s): the production path over the suite, teacher-forced, and the
# calibration with cuda as its member.
if (( $(date +%s) - t0 < 470 )); then
  timeout 60 ./build/dsv41 run --sides ref,cuda --mode teacher-forced -q > "$OUT/suite_cuda_tf.log" 2>&1
  echo "suite ref,cuda teacher-forced: rc $? $(grep -E '^[0-9]+ results:' "$OUT/suite_cuda_tf.log")"
fi
if (( $(date +%s) - t0 < 520 )); then
  timeout 60 ./build/dsv41 selftest --calibration --variants cuda --no-official > "$OUT/calibration_cuda.log" 2>&1
  echo "calibration cuda: rc $?"; tail -7 "$OUT/calibration_cuda.log"
fi
lap end

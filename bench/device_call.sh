#!/usr/bin/env bash
# bench/device_call.sh: one `run` call (at most 600 s) that does, in order of priority and under one
# deadline, what a session's device time is for when machines are scarce (bench/RESULTS.md
# "Session 20"): build everything once, the million-token session's cuda side with its sampled
# replay (wall time, device peak), then scripts/gpu_check.sh (every tests/cuda binary, both
# backends over the suite, conform, small bugs, calibration, exact), then what time is left: the
# decode step at 4096 with and without DSV41_CUDA_DEFER_CHECKS, the fp8 GEMMs, the split attention,
# the decode-shaped indexer. Each step has its own limit, so one hang loses only itself.
# --min (when little device time is left, DEADLINE about 250): build dsv41 alone, the million-token
# cuda side until the deadline, then the suite `ref,cuda` teacher-forced if 45 s are left.
# Usage: [OUT=DIR] [DEADLINE=575] [DSV41_CMAKE_ARGS=...] bench/device_call.sh [--min]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/device_out}
DEADLINE=${DEADLINE:-575}
mkdir -p "$OUT"
t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
lap() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
limit() { local l; l=$(left); (( l < $1 )) && echo "$l" || echo "$1"; }  # min(wanted, time left)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git rev-parse HEAD 2>/dev/null
MIN=0; [[ "${1:-}" == "--min" ]] && MIN=1
TESTS=$(grep -o '^TESTS="[^"]*"' scripts/gpu_check.sh | cut -d'"' -f2)
TARGETS="dsv41 $TESTS dsv41_decode_curve dsv41_fp8_linear_bench dsv41_sparse_attn_bench dsv41_index_select_bench"
(( MIN )) && TARGETS=dsv41
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1
# shellcheck disable=SC2086
cmake --build build -j"$(nproc)" --target $TARGETS > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
lap build

# 1. The million-token session, the cuda side (side B replays the sampled steps from A's state).
( while true; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits >> "$OUT/million_smi.txt"; sleep 1; done ) &
smi=$!
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 /usr/bin/time -v timeout "$( (( MIN )) && echo $(( $(left) - 5 )) || limit 160)" ./build/dsv41 run \
  scenarios/scale/million_tokens.json --config scenarios/configs/million.json --sides cuda@global,cuda@global \
  --time-sides -o "$OUT/million.h5" > "$OUT/million.log" 2>&1
echo "million: rc $?"
kill "$smi" 2>/dev/null
grep -vE '^\s+(Page|Volun|Invol|Swaps|File|Socket|Signals|Average|Exit|Minor|Major|Percent)' "$OUT/million.log" | tail -28
echo "device memory used (MiB, max over 1 s samples): $(cut -d, -f1 "$OUT/million_smi.txt" | sort -n | tail -1);" \
  "GPU utilisation mean: $(cut -d, -f2 "$OUT/million_smi.txt" | awk '{s += $1} END {if (NR) printf "%.0f%%", s / NR}')"
lap million
if (( MIN )); then
  if (( $(left) > 45 )); then
    timeout "$(( $(left) - 3 ))" ./build/dsv41 run --sides ref,cuda --mode teacher-forced -q > "$OUT/suite_cuda_tf.log" 2>&1
    echo "suite ref,cuda teacher-forced: rc $? $(grep -E '^[0-9]+ results:' "$OUT/suite_cuda_tf.log")"
  fi
  exit 0
fi

# 2. Both backends' checks.
OUT=$OUT/gc timeout "$(limit 330)" scripts/gpu_check.sh --no-sanitizer > "$OUT/gc.txt" 2>&1
echo "gpu_check: rc $?"; tail -44 "$OUT/gc.txt"
lap gpu_check

# 3. With the time left: the decode step with the deferred checks, then the kernels' benches.
for v in 0:0 0:1 1:1; do  # DSV41_CUDA_DEFER_CHECKS:DSV41_CUDA_ASYNC_UPLOADS
  (( $(left) > 40 )) || break
  DSV41_CUDA_DEFER_CHECKS=${v%:*} DSV41_CUDA_ASYNC_UPLOADS=${v#*:} timeout "$(limit 40)" ./build/bench/dsv41_decode_curve \
    --backend cuda --contexts 4096 --steps 20 --warmup 3 > "$OUT/curve_$v.log" 2>&1
  echo "decode 4096, DSV41_CUDA_DEFER_CHECKS=${v%:*} DSV41_CUDA_ASYNC_UPLOADS=${v#*:}: rc $?"; tail -5 "$OUT/curve_$v.log"
done
if (( $(left) > 30 )); then
  timeout "$(limit 40)" ./build/bench/dsv41_fp8_linear_bench --kernels pipelined_tma,ws --budget-ms 300 > "$OUT/fp8.log" 2>&1
  echo "fp8 bench: rc $?"; tail -12 "$OUT/fp8.log"
fi
if (( $(left) > 25 )); then
  timeout "$(limit 30)" ./build/bench/dsv41_sparse_attn_bench --only B1 > "$OUT/attn_b1.log" 2>&1
  echo "attention B1: rc $?"; tail -10 "$OUT/attn_b1.log"
fi
if (( $(left) > 25 )); then
  timeout "$(limit 30)" ./build/bench/dsv41_index_select_bench --only decode --reps 10 > "$OUT/index_decode.log" 2>&1
  echo "indexer decode: rc $?"; tail -16 "$OUT/index_decode.log"
fi
lap end

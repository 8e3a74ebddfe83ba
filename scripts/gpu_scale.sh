#!/usr/bin/env bash
# scripts/gpu_scale.sh: the CUDA path at scale, on a GPU machine, in one call (docs/cuda.md).
#   scenarios/scale/long_session.json on scenarios/configs/medium.json (16 layers, dim 512,
#   window 128, top-k 64, max_seq_len 4096; weights generated, seed printed): a 3,000-token prompt,
#   decode, a full resume, a follow-up, DSpark speculative rounds.
#   1. ref vs cuda-exact@full, free-running and teacher-forced: the verdict (expect bitexact)
#   2. cuda-exact vs cuda-exact@full and ref vs ref@full, free-running: each backend's own wall time (both
#      sides run the same backend, so half the comparison's time is one backend's session)
#   3. compute-sanitizer racecheck on two component tests
# Logs and reports under $OUT (default ./gpu_out); a table last.
# Usage: [DSV41_CMAKE_ARGS=...] scripts/gpu_scale.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-} \
  > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build -j"$(nproc)" --target dsv41 cuda_attention_test cuda_topk_test > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
rows=()
scale_run() {  # name, time limit (s), extra dsv41 run arguments
  local name=$1 limit=$2
  shift 2
  local t0 t1 rc
  t0=$(date +%s%N)
  timeout "$limit" ./build/dsv41 run scenarios/scale/long_session.json --config scenarios/configs/medium.json \
    "$@" -o "$OUT/$name.h5" > "$OUT/$name.log" 2> "$OUT/$name.err"
  rc=$?
  t1=$(date +%s%N)
  rows+=("$(printf '%-22s rc %3d  %8.1f s' "$name" "$rc" "$(( (t1 - t0) / 1000000 ))e-3")")
}
scale_run ref_vs_cuda 330 --sides ref,cuda-exact@full
scale_run cuda_vs_cuda 100 --sides cuda-exact,cuda-exact@full --mode free-running
scale_run ref_vs_ref 150 --sides ref,ref@full --mode free-running
for t in cuda_attention_test cuda_topk_test; do
  if timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 ./build/tests/cuda/$t > "$OUT/racecheck_$t.log" 2>&1
  then rows+=("racecheck $t: clean"); else rows+=("racecheck $t: FAIL/timeout (rc $?)"); fi
done
grep -E "weights|scenarios,|^  (pass|fail|error|inconclusive|measured)|first divergence" "$OUT/ref_vs_cuda.log" | head -12
grep -h "wall\|seconds" "$OUT"/*.err 2>/dev/null | head -5
printf '%s\n' "${rows[@]}"

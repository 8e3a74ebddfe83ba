#!/usr/bin/env bash
# scripts/gpu_check.sh: both CUDA backends on a GPU machine (the `run` tool's H100/H200), in one call.
#   1. configure (CUDA required) and build only what is checked: the tests/cuda binaries and dsv41
#   2. the CUDA test binaries (the production kernels' included: linear, sparse attention,
#      index_select; the 2^32-input encoder sweep of kv_quant_vs_reference_test is left out: it
#      has its own runs in bench/RESULTS.md)
#   3. both backends over the whole built-in suite, both modes: dsv41 run --sides ref,cuda-exact
#      (bitexact expected) and --sides ref,cuda (the production path: tolerance, judged by the
#      order-variant claim with the accumulation fp8-tensor-core, docs/conform.md "Accumulation");
#      then the production path as a port: forward --backend cuda --dump judged by conform (its
#      manifest's claim), the small-bug zoo planted in it (selftest --small-bugs --base cuda) and
#      the calibration with cuda as its member (selftest --calibration --variants cuda: no alarm)
#   4. dsv41 exact --backend ref,cuda-exact and ref,cuda (every op against its derived bound)
#   5. compute-sanitizer memcheck on the component tests (when the tool exists and time is left)
# --runs-only: skip the test binaries and the sanitizer (build dsv41 alone: steps 3-4).
# Logs go to $OUT (default: ./gpu_out); a short table is printed last.
# Usage: [DSV41_CMAKE_ARGS=...] scripts/gpu_check.sh [--no-sanitizer | --runs-only]
# The lent H200 has no nlohmann-json: scripts/device_tree.sh stages a copy (.devdeps) and trims
# the tree the run tool sends; see it for the whole call.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
JOBS=$(nproc)
declare -A RESULT
t0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || echo unknown > "$OUT/commit.txt"

# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1 \
  && RESULT[configure]=ok || RESULT[configure]=FAIL
TESTS="cuda_linear_test cuda_rmsnorm_test cuda_rope_test cuda_kv_quant_ops_test cuda_mhc_test cuda_mhc_mixes_test cuda_attention_test cuda_engram_test cuda_moe_test cuda_indexer_test cuda_topk_test cuda_compressor_test cuda_libm_expf_test cuda_linear_production_test cuda_sparse_attn_production_test cuda_index_select_production_test cuda_deferred_checks_test cuda_upload_staging_test cuda_model_test"
[[ "${1:-}" == "--runs-only" ]] && TESTS=""
# shellcheck disable=SC2086
cmake --build build -j"$JOBS" --target $TESTS dsv41 > "$OUT/build.log" 2>&1 && RESULT[build]=ok || RESULT[build]=FAIL
tb=$(date +%s)

for t in $TESTS; do
  if timeout 90 ./build/tests/cuda/$t > "$OUT/$t.log" 2>&1; then RESULT[$t]="ok ($(grep -c '^\[       OK' "$OUT/$t.log") passed)"
  else RESULT[$t]="FAIL ($(grep -c '^\[  FAILED' "$OUT/$t.log") failed lines)"; fi
done
# The staged uploads (off by default) on: their device test again with the switch set.
if [[ -n "$TESTS" ]] && DSV41_CUDA_ASYNC_UPLOADS=1 timeout 90 ./build/tests/cuda/cuda_upload_staging_test > "$OUT/upload_staging_async.log" 2>&1; then
  RESULT[upload_staging_async]="ok ($(grep -c '^\[       OK' "$OUT/upload_staging_async.log") passed)"
elif [[ -n "$TESTS" ]]; then RESULT[upload_staging_async]="FAIL (rc $?)"; fi
tt=$(date +%s)

for b in cuda-exact cuda; do  # the whole built-in suite, both modes
  if ./build/dsv41 run --sides "ref,$b" --mode free-running teacher-forced -o "$OUT/suite_$b.h5" \
      > "$OUT/suite_$b.log" 2>&1; then RESULT[suite_$b]=ok; else RESULT[suite_$b]="FAIL (rc $?)"; fi
done
P=$(seq -s, 1 40)
if ./build/dsv41 forward --config tiny --weights golden/oracle/weights.safetensors --backend cuda --prompt "$P" --decode 5 --dump "$OUT/cuda_dump" \
      > "$OUT/forward_cuda.log" 2>&1 \
   && ./build/dsv41 conform "$OUT/cuda_dump" --config tiny --weights golden/oracle/weights.safetensors -q \
      -o "$OUT/conform_cuda.h5" >> "$OUT/forward_cuda.log" 2>&1; then RESULT[conform_cuda_dump]=ok
else RESULT[conform_cuda_dump]="FAIL (rc $?)"; fi
if ./build/dsv41 selftest --small-bugs --base cuda -q > "$OUT/small_bugs_cuda.log" 2>&1; then RESULT[small_bugs_cuda]=ok
else RESULT[small_bugs_cuda]="rc $? ($(grep -o 'located [0-9]* of [0-9]*' "$OUT/small_bugs_cuda.log" | head -1))"; fi
# The production path as a member of the order-variant calibration (docs/selftest.md): its dumps of
# the four calibration scenarios judged under its claim must raise no alarm.
if ./build/dsv41 selftest --calibration --variants cuda --no-official > "$OUT/calibration_cuda.log" 2>&1; then
  RESULT[calibration_cuda]=ok; else RESULT[calibration_cuda]="FAIL (rc $?)"; fi
for b in cuda-exact cuda; do
  if ./build/dsv41 exact --backend "ref,$b" --seed 1 > "$OUT/exact_$b.log" 2>&1; then RESULT[exact_$b]=ok
  else RESULT[exact_$b]="FAIL (rc $?)"; fi
done
tr=$(date +%s)

if [[ "${1:-}" != "--no-sanitizer" && "${1:-}" != "--runs-only" ]] && command -v compute-sanitizer > /dev/null; then
  for t in cuda_linear_test cuda_rmsnorm_test cuda_kv_quant_ops_test cuda_mhc_test cuda_attention_test cuda_engram_test \
           cuda_moe_test cuda_indexer_test cuda_topk_test cuda_compressor_test; do
    if timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/tests/cuda/$t > "$OUT/memcheck_$t.log" 2>&1
    then RESULT[memcheck_$t]=clean; else RESULT[memcheck_$t]="FAIL/timeout (rc $?)"; fi
  done
fi
te=$(date +%s)

echo "== device: $(cat "$OUT/gpu.txt")  commit $(cut -c1-12 "$OUT/commit.txt")"
echo "== seconds: build $((tb - t0)), tests $((tt - tb)), runs $((tr - tt)), sanitizer $((te - tr))"
[[ -f "$OUT/cuda_model_test.log" ]] && grep -A40 "^op " "$OUT/cuda_model_test.log" | head -40
for b in cuda-exact cuda; do grep -E "^[0-9]+ (scenarios|results):|^  (fail|error) " "$OUT/suite_$b.log" | head -20; done
grep -E "^root cause|^conform:|claim:" "$OUT/forward_cuda.log" | head -5
grep -E "^located|MISSED|ALARM|ERROR" "$OUT/small_bugs_cuda.log" | head -8
grep -h "^linear F8\|^exact:" "$OUT"/exact_*.log
printf "%-34s %s\n" step result
for k in $(printf "%s\n" "${!RESULT[@]}" | sort); do printf "%-34s %s\n" "$k" "${RESULT[$k]}"; done

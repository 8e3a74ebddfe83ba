#!/usr/bin/env bash
# bench/device_min.sh: the smallest useful device call when little device time is left (bench/RESULTS.md
# "Session 20"): build dsv41 alone, then the million-token session's cuda side with its sampled
# replay until DEADLINE (wall time, progress, device peak), then the suite `ref,cuda` teacher-forced
# if time is left. Usage: [OUT=DIR] [DEADLINE=270] [DSV41_CMAKE_ARGS=...] bench/device_min.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/device_out}; DEADLINE=${DEADLINE:-270}; mkdir -p "$OUT"; t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git rev-parse HEAD 2>/dev/null
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41_REQUIRE_CUDA=ON ${DSV41_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1
cmake --build build -j"$(nproc)" --target dsv41 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== build at $(( $(date +%s) - t0 )) s"
( while true; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits >> "$OUT/smi.txt"; sleep 1; done ) &
smi=$!
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 /usr/bin/time -v timeout "$(( $(left) - 5 ))" ./build/dsv41 run \
  scenarios/scale/million_tokens.json --config scenarios/configs/million.json --sides cuda@global,cuda@global \
  --time-sides -o "$OUT/million.h5" > "$OUT/million.log" 2>&1
echo "million: rc $? at $(( $(date +%s) - t0 )) s"
kill "$smi" 2>/dev/null
grep -E "Elapsed|Maximum resident" "$OUT/million.log"
grep -vE '^\s+[A-Z][a-zA-Z ()/:]+: ' "$OUT/million.log" | tail -30
echo "device memory used (MiB, max of 1 s samples): $(cut -d, -f1 "$OUT/smi.txt" | sort -n | tail -1); GPU util mean: $(cut -d, -f2 "$OUT/smi.txt" | awk '{s+=$1} END {if (NR) printf "%.0f%%", s/NR}')"
if (( $(left) > 45 )); then
  timeout "$(( $(left) - 3 ))" ./build/dsv41 run --sides ref,cuda --mode teacher-forced -q > "$OUT/suite_cuda_tf.log" 2>&1
  echo "suite ref,cuda teacher-forced: rc $? $(grep -E '^[0-9]+ results:' "$OUT/suite_cuda_tf.log")"
fi

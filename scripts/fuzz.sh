#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, -DDSV41_FUZZ=ON, clang, ASan + UBSan) in build-fuzz and
# runs each on its committed corpus fuzz/corpus/<target>/ (read only: new inputs go to a scratch
# folder) for a short time: CI's run (issue 14, deliverable 3). A crash, an exception other
# than dsv41::Error, a sanitizer report, a leak or a hang fails the script; libFuzzer writes the
# input to crash-*/leak-*/timeout-* in the build folder's fuzz-artifacts/.
# Usage: scripts/fuzz.sh [--build-only] [TARGET...]      (default: every target)
# Environment:
#   DSV41_FUZZ_DIR    build folder (default: build-fuzz)
#   DSV41_FUZZ_TIME   seconds per target (default 20; -max_total_time)
#   DSV41_FUZZ_RUNS   executions per target instead of a time (-runs; unset: no limit)
#   DSV41_FUZZ_SEED   libFuzzer -seed (default 1; printed)
#   DSV41_FUZZ_ARGS   more libFuzzer flags
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# clang and its sanitizer/libFuzzer runtimes (Debian 12): installed here, not by setup.sh, since
# only the sanitizer jobs need them.
./scripts/apt_install.sh clang libclang-rt-14-dev
build_dir=${DSV41_FUZZ_DIR:-build-fuzz}
all=(fuzz_config fuzz_safetensors fuzz_scenario fuzz_session fuzz_report fuzz_port_dump)
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
targets=("$@")
if ((${#targets[@]} == 0)); then targets=("${all[@]}"); fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# Configured once (CI starts from a fresh tree): a re-configure takes the new git commit into
# every dsv41_scenarios object (DSV41_GIT_COMMIT_STRING) and so rebuilds them all after each
# commit. ninja still re-runs CMake when a CMakeLists.txt changes.
if [ ! -f "$build_dir/build.ninja" ]; then
  # No -Werror here: clang's warnings differ from gcc's (the normal build is the -Werror one).
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=None -DDSV41_FUZZ=ON \
    -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only" -DCMAKE_C_FLAGS="-O1" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DDSV41_ENABLE_CUDA=OFF \
    -DDSV41_BUILD_TESTS=ON -DDSV41_WERROR=OFF "${launcher[@]}" >/dev/null
fi
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"
if ((build_only)); then exit 0; fi

seed=${DSV41_FUZZ_SEED:-1}
limit=(-max_total_time="${DSV41_FUZZ_TIME:-20}")
if [ -n "${DSV41_FUZZ_RUNS:-}" ]; then limit=(-runs="$DSV41_FUZZ_RUNS"); fi
artifacts=$root/$build_dir/fuzz-artifacts
mkdir -p "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp}
echo "fuzz: seed $seed (DSV41_FUZZ_SEED overrides), ${limit[*]} per target"
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  echo "fuzz: $t"
  # fuzz_report: the reader's probe worker (h5/h5_probe.h) inherits libFuzzer's malloc
  # hook; a crafted file may make libhdf5 allocate gigabytes there, which is the probe's to
  # judge (the parent's RSS stays limited by -rss_limit_mb).
  extra=()
  if [ "$t" = fuzz_report ]; then extra=(-malloc_limit_mb=1000000); fi
  # shellcheck disable=SC2086
  if ! "$build_dir/fuzz/$t" "$scratch" "fuzz/corpus/$t" -seed="$seed" "${limit[@]}" \
        -timeout=10 -rss_limit_mb=2560 -print_final_stats=1 "${extra[@]}" \
        -artifact_prefix="$artifacts/$t-" ${DSV41_FUZZ_ARGS:-} 2>"$artifacts/$t.log"; then
    tail -n 60 "$artifacts/$t.log"
    echo "fuzz: $t FAILED (input and log in $artifacts)" >&2
    rm -rf "$scratch"
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$artifacts/$t.log" | tr '\n' ' '
  echo
  rm -rf "$scratch"
done
echo "fuzz: every target ran clean"

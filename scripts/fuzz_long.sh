#!/usr/bin/env bash
# scripts/fuzz_long.sh: the long fuzz runs of docs/errors.md "Fuzzing" on a machine with many
# cores: every target at once, each in libFuzzer's fork mode with its own number of workers, for
# a fixed time, on a copy of its committed corpus (fuzz/corpus/<target>/ stays untouched).
# Usage: scripts/fuzz_long.sh SECONDS TARGET:WORKERS...
#   e.g. scripts/fuzz_long.sh 540 fuzz_session:6 fuzz_report:5 fuzz_port_dump:3 fuzz_safetensors:2
# Environment:
#   DSV41_FUZZ_BIN_DIR  where the targets are (default build-fuzz/fuzz: scripts/fuzz.sh --build-only)
#   DSV41_FUZZ_SEED     libFuzzer -seed (default 1)
#   OUT                 logs and crash inputs (default ./fuzz_long_out): <target>.log, <target>-crash-*
#   DSV41_FUZZ_CORPUS   the seed folder instead of fuzz/corpus/<target> (one target only)
#   DSV41_FUZZ_ARGS     more libFuzzer flags (e.g. -max_len=65536)
#   DSV41_FUZZ_MODE     fork (default: libFuzzer's -fork=WORKERS) or jobs (-jobs=WORKERS
#                       -workers=WORKERS: independent fuzzers sharing the corpus folder, no restart
#                       per short job; logs in OUT/<target>-jobs/fuzz-<i>.log, executions summed)
# A line per target is printed at the end: executions (libFuzzer's last "#N" count, all workers),
# exec/s, corpus size, and "clean" or the first finding.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: fuzz_long.sh SECONDS TARGET:WORKERS...}
shift
bin=${DSV41_FUZZ_BIN_DIR:-build-fuzz/fuzz}
seed=${DSV41_FUZZ_SEED:-1}
OUT=${OUT:-$PWD/fuzz_long_out}
mkdir -p "$OUT"
# ASan's run-time options (ASAN_OPTIONS set outside wins). Besides halting on the first report:
# a 16 MB quarantine (default 256 MB: use-after-free is still caught for the last 16 MB freed), no
# return of freed memory to the system, and no 0xbe fill of new blocks (a debugging aid, not a
# check). The same kinds of error are checked (use-after-free in a narrower window); the fuzzed
# process stays small, so each fork of the report probe's worker (h5/h5_probe.h) copies
# and write-faults far fewer pages:
# fuzz_report 83 -> 198 exec/s per process over its first 150 s (bench/RESULTS.md, "Fuzzing: the long runs", seventh round).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1:quarantine_size_mb=16:allocator_release_to_os_interval_ms=-1:max_malloc_fill_size=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp}
pids=()
for spec in "$@"; do
  t=${spec%%:*}
  workers=${spec#*:}
  work=$(mktemp -d)
  cp -r "${DSV41_FUZZ_CORPUS:-fuzz/corpus/$t}/." "$work/"
  extra=()
  if [ "$t" = fuzz_report ]; then extra=(-malloc_limit_mb=1000000); fi
  # shellcheck disable=SC2206
  extra+=(${DSV41_FUZZ_ARGS:-})
  if [ "${DSV41_FUZZ_MODE:-fork}" = jobs ]; then
    mkdir -p "$OUT/$t-jobs"
    # Each job gets its own seed (seed + job index: libFuzzer's -jobs would reuse one -seed).
    (cd "$OUT/$t-jobs" && for ((j = 0; j < workers; j++)); do
       "$bin/$t" "$work" -seed=$((seed + j)) -max_total_time="$secs" -timeout=10 \
         -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix="$OUT/$t-" "${extra[@]}" \
         > "fuzz-$j.log" 2>&1 &
     done
     rc=0
     for job in $(jobs -p); do wait "$job" || rc=$?; done
     exit "$rc") > "$OUT/$t.log" 2>&1 &
  else
    "$bin/$t" "$work" -fork="$workers" -seed="$seed" -max_total_time="$secs" -timeout=10 \
      -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix="$OUT/$t-" "${extra[@]}" \
      > "$OUT/$t.log" 2>&1 &
  fi
  pids+=("$!:$t:$work")
done
for p in "${pids[@]}"; do
  pid=${p%%:*}
  rest=${p#*:}
  t=${rest%%:*}
  work=${rest#*:}
  wait "$pid"
  rc=$?
  if [ -d "$OUT/$t-jobs" ]; then
    # The jobs' own totals (stat::number_of_executed_units), summed.
    total=$(cat "$OUT/$t-jobs"/fuzz-*.log | awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}')
    ended=$(grep -l stat::number_of_executed_units "$OUT/$t-jobs"/fuzz-*.log | wc -l)
    last="#$total executions in $ended of $(ls "$OUT/$t-jobs"/fuzz-*.log | wc -l) jobs"
    cat "$OUT/$t-jobs"/fuzz-*.log >> "$OUT/$t.log"
  else
    last=$(grep -E '^#[0-9]+' "$OUT/$t.log" | tail -n 1)
  fi
  units=$(find "$work" -type f | wc -l)
  verdict=clean
  if [ "$rc" -ne 0 ]; then verdict="exit $rc: $(grep -m1 -E 'ERROR|deadly|timeout|leak|out-of-memory' "$OUT/$t.log")"; fi
  echo "$t: rc $rc; last: ${last:-none}; corpus $units units; $verdict"
  rm -rf "$work"
done

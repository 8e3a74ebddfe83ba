#!/usr/bin/env bash
# bench/reference_speed.sh: the CPU reference's speed on the oracle run (333-token prefill + 8
# decode steps, golden/oracle), measured side by side for two builds, interleaved so that both see
# the same machine load. Each probe (tests/determinism/dsv41_determinism_probe_O3) prints the
# forward's wall time and a hash of every output; the hashes of the two builds must agree (the
# same bits), else the comparison is refused.
#
#   bench/reference_speed.sh OLD_PROBE NEW_PROBE [RUNS] [THREADS...]
#     RUNS     runs per build and thread count (default 7)
#     THREADS  thread counts (default: 1 2)
# Prints per thread count: min and median seconds of each build, and the speed-up of the medians.
# Example (the old build from a checkout of an older commit):
#   bench/reference_speed.sh /tmp/old/tests/determinism/dsv41_determinism_probe_O3 \
#       build/tests/determinism/dsv41_determinism_probe_O3
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?old probe}; new=${2:?new probe}; runs=${3:-7}; shift 3 2>/dev/null || shift $#
threads=("$@"); [ ${#threads[@]} -gt 0 ] || threads=(1 2)
oracle=golden/oracle

one() {  # probe threads -> "<seconds> <hash>"
  local out err
  err=$(mktemp)
  out=$(DSV41_THREADS=$2 "$1" "$oracle" 333 2>"$err")
  local secs
  secs=$(sed -n 's/^forward (prefill + decode): \([0-9.]*\) s$/\1/p' "$err")
  rm -f "$err"
  echo "$secs ${out%% *}"
}

stats() {  # numbers on stdin -> "min median"
  sort -g | awk '{v[NR]=$1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f", v[1], m}'
}

echo "reference speed: oracle run (333 + 8), $runs runs per build, interleaved; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${threads[@]}"; do
  o=(); n=(); oh=""; nh=""
  for ((i = 0; i < runs; i++)); do
    read -r s h <<<"$(one "$old" "$t")"; o+=("$s"); oh=$h
    read -r s h <<<"$(one "$new" "$t")"; n+=("$s"); nh=$h
  done
  if [ "$oh" != "$nh" ]; then
    echo "threads=$t: the builds give different bits ($oh vs $nh): no speed comparison" >&2
    exit 1
  fi
  read -r omin omed <<<"$(printf '%s\n' "${o[@]}" | stats)"
  read -r nmin nmed <<<"$(printf '%s\n' "${n[@]}" | stats)"
  echo "threads=$t  $oh  old: min ${omin} s, median ${omed} s   new: min ${nmin} s, median ${nmed} s   speed-up (medians) $(awk -v a="$omed" -v b="$nmed" 'BEGIN {printf "%.2fx", a / b}')"
done

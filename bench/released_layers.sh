#!/usr/bin/env bash
# bench/released_layers.sh: one layer of each kind of the released schedule at a base config's
# dims (default: the `full` preset, the released dims), CPU reference vs CUDA on the same inputs
# (issue 17, "Released dimensions"; docs/released-dims.md).
#
# For each kind: `dsv41 layer-config` derives the kind's config from the base; the weights are
# generated in memory from --weight-seed in the official checkpoint format (the bytes `dsv41
# weights` writes) and held with packed F4 experts; `dsv41 run` replays a prompt of P random tokens
# (one prefill step) and D decode steps (the dspark kind: one speculative round of DSpark drafts
# in between) on both sides in lockstep, free-running, every layer's components compared (bit
# for bit where the pair's expectation is bitexact: ref vs cuda-exact), the HDF5 report per kind.
# Prints per kind: verdict, time of each side (backend setup = model copy and, for cuda, the weight
# upload; steps = the forward with its captures), peak host memory of the process, peak device
# memory (nvidia-smi, sampled every 200 ms; "-" without it) and the wall time.
#
# Usage: bench/released_layers.sh [--dsv41 BIN] [--base full|FILE] [--kinds a,b,...] [--sides A,B]
#          [--prompt P] [--decode D] [--weight-seed S] [--seed S] [--threads N] [--out DIR]
# Defaults: build/dsv41, full, every kind, ref,cuda-exact where nvidia-smi exists (else ref,ref@alone:
# the reference on both sides), P 8, D 2, weight seed 1, out released-layers.
# Exit: 0 when every kind passed, 1 when one diverged, 2 on an error.
set -uo pipefail

bin=build/dsv41 base=full kinds="" sides="" prompt=8 decode=2 wseed=1 seed=7 threads="" out=released-layers
while (($#)); do
  case "$1" in
    --dsv41) bin=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --kinds) kinds=$2; shift 2 ;;
    --sides) sides=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --weight-seed) wseed=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "released_layers.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "released_layers.sh: '$bin' is not an executable dsv41 (--dsv41 BIN)" >&2; exit 2; }
for v in "$prompt" "$decode" "$wseed" "$seed"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "released_layers.sh: '$v' is not a non-negative integer" >&2; exit 2; }
done
((prompt >= 1)) || { echo "released_layers.sh: --prompt must be at least 1" >&2; exit 2; }
if [[ -z $kinds ]]; then kinds=$("$bin" layer-config --list | awk '{print $1}' | paste -sd, -); fi
if [[ -z $sides ]]; then
  if command -v nvidia-smi >/dev/null; then sides=ref,cuda-exact
  else sides=ref,ref@alone; fi
fi
mkdir -p "$out" || exit 2
thr=(); [[ -n $threads ]] && thr=(--threads "$threads")

printf '# released layers: base %s, sides %s, prompt %d + decode %d, weight seed %s, token seed %s\n' \
  "$base" "$sides" "$prompt" "$decode" "$wseed" "$seed"
printf '%-8s %-12s %-9s %-22s %-22s %-10s %-10s %-8s\n' kind layers verdict \
  "${sides%%,*} setup/steps s" "${sides#*,} setup/steps s" "host GB" "device GB" "wall s"
worst=0
IFS=, read -ra kind_list <<<"$kinds"
for k in "${kind_list[@]}"; do
  cfg=$out/$k.config.json scen=$out/$k.scenario.json log=$out/$k.log
  if ! "$bin" layer-config --base "$base" --kind "$k" -o "$cfg" >"$log" 2>&1; then
    printf '%-8s %-12s %-9s %s\n' "$k" - error "$(tail -1 "$log")"; worst=2; continue
  fi
  layers=$(grep -o '[0-9]* layer(s), layer [0-9]*' "$log" | sed 's/ layer(s), layer /:/')
  spec=""
  if [[ $k == dspark ]]; then spec='{"speculate": 1, "drafts": "dspark", "policy": "fixed:4"},'; fi
  cat >"$scen" <<JSON
{
  "name": "released_$k",
  "kind": "released_layer",
  "description": "one released layer of kind $k: a prompt of $prompt random tokens in one step, then decode",
  "seed": $seed,
  "events": [
    {"prompt": [{"random": $prompt}]},
    $spec
    {"decode": $decode}
  ],
  "pairs": [
    {"a": "ref", "b": "ref@alone", "expect": "bitexact", "why": "the same reference on a fresh backend"}
  ],
  "modes": ["free-running"]
}
JSON
  gpu_log=$out/$k.gpu.txt smi=""
  : >"$gpu_log"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$gpu_log" 2>/dev/null &
    smi=$!
  fi
  start=$(date +%s%N)
  "$bin" run "$scen" --config "$cfg" --weight-seed "$wseed" --sides "$sides" --mode free-running \
    --packed-experts --time-sides -q "${thr[@]}" -o "$out/$k.h5" >"$out/$k.summary.txt" 2>>"$log"
  rc=$?
  ms=$((($(date +%s%N) - start) / 1000000)); wall=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  [[ -n $smi ]] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  case $rc in 0) verdict=pass ;; 1) verdict=DIVERGED ;; 3) verdict=inconcl. ;; *) verdict="error($rc)" ;; esac
  ((rc == 1 && worst < 1)) && worst=1
  ((rc != 0 && rc != 1)) && worst=2
  t=$(grep -a 'dsv41 run: time ' "$log" | tail -1)
  a_t=$(sed -n 's/.*\]: [^ ]* setup \([0-9.]*\) s steps \([0-9.]*\) s; .*/\1\/\2/p' <<<"$t")
  b_t=$(sed -n 's/.*; [^ ]* setup \([0-9.]*\) s steps \([0-9.]*\) s; .*/\1\/\2/p' <<<"$t")
  host=$(sed -n 's/.*peak host memory[[:space:]]*\([0-9]*\) kB.*/\1/p' "$log" | awk '{printf "%.2f", $1 / 1048576}')
  dev=$(sort -n "$gpu_log" | tail -1 | awk '{printf "%.1f", $1 / 1024}')
  printf '%-8s %-12s %-9s %-22s %-22s %-10s %-10s %-8s\n' "$k" "${layers:--}" "$verdict" "${a_t:--}" \
    "${b_t:--}" "${host:--}" "${dev:--}" "$wall"
  if ((rc != 0)); then sed 's/^/    /' "$out/$k.summary.txt" | head -20; grep -i 'error' "$log" | head -3; fi
done
exit $worst

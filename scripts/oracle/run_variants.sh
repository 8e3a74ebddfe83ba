#!/bin/bash
# Run oracle variants on the lent device (scripts/oracle/README.md). Usage, from a checkout whose
# git-ignored .oracle/ holds the assembled official package (.oracle/pkg/v41, .oracle/upstream) and
# copies of this folder's scripts:
#   run(command="bash .oracle/run_variants.sh w16_r2early_p520 w128_r2early_p389 w128_long_p1531", carry=[".oracle"])
# Each variant: OUT=/tmp/orc/<name>, ORACLE_VARIANT=variants/<name>.json, ORACLE_TIE_RULE=lowest_index.
# VERIFY=1 also runs the unmodified harness.py (torch tie rule) and hashes its datasets, to be compared
# with ../shared/oracle (manifest.py on both sides): a check that the official code was assembled exactly.
# GOLDEN=1 (run_golden.sh): each run compacted there by make_golden.py --dspark-internals, and the
# compact golden/<variant>/ folders come back instead of the raw runs and their manifests.
# Runs one at a time: harness.py sets torch to 16 threads, and 4 runs side by side on 16 cores made a
# 333-token prefill take 160-190 s instead of about 1 s (results were unchanged, bit for bit).
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
W=/tmp/orc; rm -rf $W; mkdir -p $W/golden
python3 -c 'import torch, h5py; print("torch", torch.__version__, "h5py", h5py.__version__)'
t0=$(date +%s)
if [ -n "$VERIFY" ]; then
  mkdir -p $W/tv && OUT=$W/verify TMPDIR=$W/tv python3 harness.py > $W/verify.out 2>&1; echo "verify rc=$?"
  python3 manifest.py $W/verify > $W/verify_manifest.json
fi
for v in "$@"; do
  mkdir -p $W/t_$v && OUT=$W/$v TMPDIR=$W/t_$v ORACLE_VARIANT=variants/$v.json ORACLE_TIE_RULE=lowest_index \
    python3 harness_variant.py > $W/$v.out 2>&1; echo "$v rc=$? at $(( $(date +%s) - t0 )) s"
  for f in $W/$v/*.h5; do python3 compact.py $f $f.c 0 && mv $f.c $f; done   # drop f32 copies of bf16 items
  if [ -n "$GOLDEN" ]; then
    python3 make_golden.py $W/$v $W/golden/$v --dspark-internals >> $W/$v.out 2>&1; echo "  golden rc=$?"
    du -sk $W/golden/$v
  else
    python3 manifest.py $W/$v > $W/${v}_manifest.json
  fi
done
if [ -n "$GOLDEN" ]; then
  cd $W && tar cf misc.tar *.out */run*.log $(ls verify_manifest.json 2>/dev/null) && cd - >/dev/null
  files="golden/%s/weights.safetensors golden/%s/config.json golden/%s/SHA256SUMS golden/%s/prefill.h5 golden/%s/prefill_streams.h5 golden/%s/decode.h5"
else
  cd $W && tar cf misc.tar *_manifest.json *.out */run*.log */config.json && cd - >/dev/null
  files="%s/weights.safetensors %s/prefill_streams_lowtie.h5 %s/decode_lowtie.h5 %s/prefill_lowtie.h5 %s/prefill_attn_lowtie.h5"
fi
{ echo misc.tar; for v in "$@"; do for f in $files; do printf "$f\n" "$v"; done; done; } > $W/prio.txt
python3 pack.py $W $OUT $W/prio.txt   # what does not fit in one return stays in /tmp/orc (pack.py again with another list)
grep -h -E "status:|FAILED|argmax per step|Error|error" $W/*.out | cut -c1-300
echo "total $(( $(date +%s) - t0 )) s"

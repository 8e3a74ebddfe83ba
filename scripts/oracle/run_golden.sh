#!/bin/bash
# Make compact golden runs on the lent device in one call (scripts/oracle/README.md): each variant is run
# with the lowest-index tie rule (harness_variant.py), compacted there by make_golden.py with the DSpark
# internals kept (--dspark-internals), and the compact folders come back as tars (pack.py), far smaller
# than the raw runs. Usage, from a checkout whose git-ignored .oracle/ holds the assembled official
# package and copies of this folder's scripts and variants/:
#   run(command="VERIFY=1 bash .oracle/run_golden.sh s6_w8_topk6_p61 s6_pool_w16_p40 ...", carry=[".oracle"])
# (VERIFY=1 also runs the unmodified harness.py; compare its verify_manifest.json with manifest.py ../shared/oracle).
# A helper's worktree does not travel: the device sends the session's own checkout, so copy .oracle into an
# ignored folder of that checkout and carry that one.
# Untar the bundles into golden/runs/ (each holds golden/<variant>/...), then check SHA256SUMS.
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
W=/tmp/orc; rm -rf $W; mkdir -p $W/golden
python3 -c 'import torch, h5py; print("torch", torch.__version__, "h5py", h5py.__version__)'
t0=$(date +%s)
if [ -n "$VERIFY" ]; then  # the unmodified harness too: its manifest against ../shared/oracle checks the assembly
  mkdir -p $W/tv && OUT=$W/verify TMPDIR=$W/tv python3 harness.py > $W/verify.out 2>&1; echo "verify rc=$?"
  python3 manifest.py $W/verify > $W/verify_manifest.json
fi
for v in "$@"; do
  mkdir -p $W/t_$v && OUT=$W/$v TMPDIR=$W/t_$v ORACLE_VARIANT=variants/$v.json ORACLE_TIE_RULE=lowest_index \
    python3 harness_variant.py > $W/$v.out 2>&1; echo "$v rc=$? at $(( $(date +%s) - t0 )) s"
  for f in $W/$v/*.h5; do python3 compact.py $f $f.c 0 && mv $f.c $f; done   # drop f32 copies of bf16 items
  python3 make_golden.py $W/$v $W/golden/$v --dspark-internals >> $W/$v.out 2>&1; echo "  golden rc=$?"
  du -sk $W/golden/$v
done
cd $W && tar cf misc.tar *.out */run*.log $(ls verify_manifest.json 2>/dev/null) && cd - >/dev/null
{ echo misc.tar; for v in "$@"; do for f in weights.safetensors config.json SHA256SUMS prefill.h5 prefill_streams.h5 decode.h5; do echo golden/$v/$f; done; done; } > $W/prio.txt
python3 pack.py $W $OUT $W/prio.txt
grep -h -E "status:|FAILED|argmax per step|Error|error" $W/*.out | cut -c1-300
echo "total $(( $(date +%s) - t0 )) s"

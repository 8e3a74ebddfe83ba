#!/bin/bash
# Make compact golden runs on the lent device in one call (scripts/oracle/README.md): run_variants.sh
# with GOLDEN=1: each variant run with the lowest-index tie rule (harness_variant.py), compacted there
# by make_golden.py with the DSpark internals kept (--dspark-internals), and the compact folders come
# back as tars (pack.py), far smaller than the raw runs. Usage, from a checkout whose git-ignored
# .oracle/ holds the assembled official package and copies of this folder's scripts and variants/:
#   run(command="VERIFY=1 bash .oracle/run_golden.sh s6_w8_topk6_p61 s6_pool_w16_p40 ...", carry=[".oracle"])
# (VERIFY=1 also runs the unmodified harness.py; compare its verify_manifest.json with manifest.py ../shared/oracle).
# A helper's worktree does not travel: the device sends the session's own checkout, so copy .oracle into an
# ignored folder of that checkout and carry that one.
# Untar the bundles into golden/runs/ (each holds golden/<variant>/...), then check SHA256SUMS.
GOLDEN=1 exec bash "$(dirname "$0")/run_variants.sh" "$@"

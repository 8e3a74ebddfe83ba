#!/usr/bin/env python3
"""Compact golden copy of one oracle harness run (scripts/oracle/README.md).

    /usr/bin/python3 scripts/oracle/make_golden.py RUN_DIR OUT_DIR [--skip-prefill-index-score]

RUN_DIR holds a harness_variant.py run (config.json, weights.safetensors, prefill*.h5,
prefill_streams*.h5, decode*.h5; the _lowtie suffix of a lowest_index run is optional).
OUT_DIR receives what a teacher-forced agreement check reads, with the oracle's item names,
attributes and values unchanged (float32 copies of bf16 items dropped: f32 = bits << 16):

  config.json, weights.safetensors   verbatim
  prefill.h5          tokens, logits, per-layer selections (indexer_topk, candidates, gate_indices),
                      next_pre, Engram ids, attn_out, ffn_out, the mHC mixes hc_{attn,ffn}_{pre,post,comb},
                      index_score (indexer layers), the Engram token map, prefill compressor states,
                      DSpark ring
  prefill_streams.h5  embed and every layer's out_stream
  decode.h5           per step: input token, logits, main_hidden, embed, per-layer out_stream,
                      engram_out, attn_out, ffn_out, next_pre, the mHC mixes, selections, index_score,
                      Engram ids, DSpark drafts, compressor states; final_state (every cache)
  SHA256SUMS

--dspark-internals also keeps the DSpark internals the run recorded (DSPARK_INTERNALS below).

--skip-prefill-index-score leaves the prefill's index_score items out (the bf16 [1, T, n_compressed]
scores of each indexer layer; w128_long_p1531's, at 1531 tokens, take 2.86 MB compressed, 3.03 MB with
the decode steps' ones, over the 3 MB a variant's copy may grow by for them); prefill.h5 then says so
in its root attribute `omitted`. Decode steps keep theirs (0.16 MB there).

Written with HDF5's earliest/v110 format (Debian's libhdf5 1.10 reads it), gzip 9 + shuffle on
datasets over 16 KiB, no timestamps: the same run gives the same bytes. Every copied dataset is
read back and compared with its source before the folder is complete.
"""
import hashlib
import json
import os
import re
import shutil
import sys

import h5py
import numpy as np

LOW = os.environ.get("GOLDEN_LIBVER_LOW", "v108")  # v108 groups are far smaller than earliest; both readable by libhdf5 1.10
LIBVER = {"earliest": h5py.h5f.LIBVER_EARLIEST, "v108": h5py.h5f.LIBVER_V18, "v110": h5py.h5f.LIBVER_V110}
L = r"layer\d\d"
KEEP = {
    "prefill": re.compile(
        r"^prefill/(tokens|logits_last|logits_all|output_ids)$"
        rf"|^prefill/{L}/(indexer_topk|candidates|candidates_compress_lens|gate_indices|next_pre|engram_hash_ids"
        r"|attn_out|ffn_out|hc_(attn|ffn)_(pre|post|comb)|index_score)$"
        r"|^prefill/state/engram/[a-z_]+$"
        rf"|^prefill/state/{L}/compressor_(kv|score)_state$"
        r"|^prefill/state/dspark0/window_kv_cache$"),
    "prefill_streams": re.compile(rf"^prefill/(embed|{L}/out_stream)$"),
    "decode": re.compile(
        r"^decode/step\d+/(input_token|logits|output_ids|main_hidden|embed)$"
        rf"|^decode/step\d+/{L}/(out_stream|engram_out|attn_out|ffn_out|next_pre|indexer_topk|candidates"
        r"|candidates_compress_lens|gate_indices|engram_hash_ids|hc_(attn|ffn)_(pre|post|comb)|index_score)$"
        r"|^decode/step\d+/dspark/(draft_ids|draft_logits|confidence)$"
        rf"|^decode/step\d+/state/{L}/compressor_(kv|score)_state$"
        r"|^decode/final_state/.+$"),
}
# --dspark-internals: what locates a DSpark difference (docs/agreement.md, DSpark): the prefill's main_hidden
# and every Engram's output, and per decode step everything forward_spec recorded (main_x, each block's mixes,
# inputs, sparse_attn q/kv/out, attn_out, experts, ffn_out, out_stream, the Markov items, the ring after the step).
DSPARK_INTERNALS = {
    "prefill": r"^prefill/main_hidden$|^prefill/dspark/.+$",
    "prefill_streams": rf"^prefill/{L}/engram_out$",
    "decode": r"^decode/step\d+/dspark/.+$",
}
DESCRIPTION = {
    "prefill": "compact subset of the run's prefill file: what a teacher-forced agreement check reads",
    "prefill_streams": "compact subset of the run's prefill_streams file: the embedding and every layer's out_stream",
    "decode": "compact subset of the run's decode file: per-step streams, selections, logits, DSpark drafts; final caches",
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def source(run, base):
    for suf in ("_lowtie", ""):
        p = os.path.join(run, base + suf + ".h5")
        if os.path.exists(p):
            return p
    raise SystemExit(f"{run}: no {base}.h5")


_GCPL = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
_GCPL.set_obj_track_times(False)  # no timestamps in group headers: the same run gives the same bytes
_GCPL.set_attr_phase_change(64, 32)  # attributes in the object header, never in a heap (heap blocks carry stray bytes)


def group(fo, path):
    g = fo
    for part in path.split("/"):
        if part not in g:
            h5py.h5g.create(g.id, part.encode(), gcpl=_GCPL)
        g = g[part]
    return g


def fixed(v):
    """str attributes as fixed-length ASCII/UTF-8 strings (no global heap: byte-reproducible files)"""
    return np.bytes_(v.encode()) if isinstance(v, str) else v


def compact(src, dst, keep, desc, omitted=None):
    items = []
    with h5py.File(src, "r") as fi:
        fi.visititems(lambda n, o: items.append(n) if isinstance(o, h5py.Group) and "meaning" in o.attrs and keep.search(n) else None)
        fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
        fcpl.set_obj_track_times(False)  # the root group too
        fcpl.set_attr_phase_change(64, 32)
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_libver_bounds(*(LIBVER[v] for v in (LOW, "v110")))
        with h5py.File(h5py.h5f.create(dst.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)) as fo:
            for k in sorted(fi.attrs):
                fo.attrs[k] = fixed(fi.attrs[k])
            fo.attrs["description"] = fixed(desc + "; " + str(fi.attrs.get("description", "")))
            fo.attrs["source_file"] = fixed(os.path.basename(src))
            fo.attrs["source_sha256"] = fixed(sha256(src))
            fo.attrs["f32_copies"] = fixed("none: bf16 items hold bits only; f32 = (uint32(bits) << 16) viewed as float32")
            if omitted:
                fo.attrs["omitted"] = fixed(omitted)
            for name in items:
                gi, go = fi[name], group(fo, name)
                for k in sorted(gi.attrs):
                    go.attrs[k] = fixed(gi.attrs[k])
                bf16 = gi.attrs.get("torch_dtype", "") == "bfloat16"
                if bf16 and "f32" in gi:
                    go.attrs["layout"] = fixed("bits: uint16 bfloat16 bit patterns (float32 copy omitted: f32 = bits << 16)")
                for dk in sorted(gi):
                    if bf16 and dk == "f32":
                        continue
                    a = gi[dk][()]
                    kw = dict(compression="gzip", compression_opts=9, shuffle=True) if a.nbytes > 16384 else {}
                    go.create_dataset(dk, data=a, track_times=False, **kw)
    # read back and compare every dataset with its source
    with h5py.File(src, "r") as fi, h5py.File(dst, "r") as fo:
        n = 0
        for name in items:
            for dk in fo[name]:
                a, b = fi[name][dk][()], fo[name][dk][()]
                if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                    raise SystemExit(f"{dst}: {name}/{dk} differs from the source")
                n += 1
    return len(items), n


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if len(args) != 2 or set(flags) - {"--skip-prefill-index-score", "--dspark-internals"}:
        raise SystemExit(__doc__)
    run, out = args
    keep, omitted = dict(KEEP), {}
    if "--skip-prefill-index-score" in flags:
        pattern = KEEP["prefill"].pattern
        assert pattern.count("|index_score)$") == 1
        keep["prefill"] = re.compile(pattern.replace("|index_score)$", ")$"))
        omitted["prefill"] = ("prefill/layerNN/index_score (bf16 indexer scores), left out by make_golden.py "
                              "--skip-prefill-index-score to keep the copy small; the full run has them")
    if "--dspark-internals" in flags:
        for base, extra in DSPARK_INTERNALS.items():
            keep[base] = re.compile(keep[base].pattern + "|" + extra)
    os.makedirs(out, exist_ok=True)
    for fn in ("config.json", "weights.safetensors"):
        shutil.copyfile(os.path.join(run, fn), os.path.join(out, fn))
    for base in ("prefill", "prefill_streams", "decode"):
        ni, nd = compact(source(run, base), os.path.join(out, base + ".h5"), keep[base], DESCRIPTION[base], omitted.get(base))
        print(f"{out}/{base}.h5: {ni} items, {nd} datasets, {os.path.getsize(os.path.join(out, base + '.h5'))} bytes")
    names = sorted(f for f in os.listdir(out) if f != "SHA256SUMS")
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        for fn in names:
            f.write(f"{sha256(os.path.join(out, fn))}  {fn}\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Regenerates golden/vectors/kernels_quant.h5 from the oracle's kernels.h5.

The oracle file (shared/oracle/kernels.h5, beside the repository) holds outputs of the official
DeepSeek-V4.1-Flash inference code. The tests must not read shared/, so this script copies the
part they need into the repository: every quant/<set> group with only the datasets the format
tests compare, plus quant/FP4_TABLE. Values are copied unchanged, as the same dtypes; the
datasets are gzip-compressed (with byte shuffle) and written without timestamps, so the output
is byte-for-byte reproducible from the same oracle file.

Review rule: golden files change only by rerunning this script on the oracle, never by hand.

Usage (from anywhere; needs python3-h5py and python3-numpy):
  /usr/bin/python3 scripts/extract_golden.py [--oracle PATH] [--out PATH]
The default oracle is ../shared/oracle/kernels.h5, else its verbatim copy golden/oracle/kernels.h5.
"""

import argparse
import hashlib
import os
import sys

import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_ORACLE = os.path.join(REPO, "..", "shared", "oracle", "kernels.h5")
COPIED_ORACLE = os.path.join(REPO, "golden", "oracle", "kernels.h5")  # verbatim copy
DEFAULT_ORACLE = SHARED_ORACLE if os.path.exists(SHARED_ORACLE) else COPIED_ORACLE
DEFAULT_OUT = os.path.join(REPO, "golden", "vectors", "kernels_quant.h5")

# item -> datasets kept. Dropped: the float32 copies ("f32"), which equal bits << 16 (bf16) or the
# decoded codes, and so carry no extra information.
ITEMS = {
    "input": ["bits"],                  # [rows, width] uint16 bf16 patterns
    "fp8_q": ["bits"],                  # [rows, width] uint8 E4M3 codes
    "fp8_scale": ["bits"],              # [rows, width/32] uint8 E8M0
    "fp8_qdq": ["bits"],                # [rows, width] uint16 bf16
    "fp4_e8m0_b32_q": ["bits", "codes"],  # [rows, width/2] packed, [rows, width] codes
    "fp4_e8m0_b32_scale": ["bits"],     # [rows, width/32] uint8 E8M0
    "fp4_e8m0_b32_qdq": ["bits"],       # [rows, width] uint16 bf16
    "fp4_e4m3_b16_q": ["bits", "codes"],  # [rows, width/2] packed, [rows, width] codes
    "fp4_e4m3_b16_scale": ["bits"],     # [rows, width/16] uint8 E4M3
    "fp4_e4m3_b16_qdq": ["bits"],       # [rows, width] uint16 bf16
}
GROUP_ATTRS = ("meaning", "layout", "torch_dtype", "shape")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_attrs(src, dst):
    for key in GROUP_ATTRS:
        if key in src.attrs:
            dst.attrs[key] = src.attrs[key]


def write_dataset(group, name, data):
    group.create_dataset(name, data=data, compression="gzip", compression_opts=9, shuffle=True,
                         track_times=False)


def extract(oracle, out):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    with h5py.File(oracle, "r") as src, h5py.File(tmp, "w", track_order=False) as dst:
        dst.attrs["source"] = "shared/oracle/kernels.h5 (quant/*)"
        dst.attrs["source_sha256"] = sha256(oracle)
        dst.attrs["producer"] = "scripts/extract_golden.py"
        quant_src = src["quant"]
        quant = dst.create_group("quant")
        table = quant.create_group("FP4_TABLE")
        copy_attrs(quant_src["FP4_TABLE"], table)
        write_dataset(table, "value", quant_src["FP4_TABLE/value"][()])
        sets = sorted(k for k in quant_src if k != "FP4_TABLE")
        for name in sets:
            gs = quant_src[name]
            gd = quant.create_group(name)
            for item, datasets in ITEMS.items():
                item_src = gs[item]
                item_dst = gd.create_group(item)
                copy_attrs(item_src, item_dst)
                for ds in datasets:
                    write_dataset(item_dst, ds, item_src[ds][()])
    verify(oracle, tmp)
    os.replace(tmp, out)
    return sets


def verify(oracle, out):
    """Every copied dataset equals its source, value for value and dtype for dtype."""
    with h5py.File(oracle, "r") as src, h5py.File(out, "r") as dst:
        def check(name, obj):
            if isinstance(obj, h5py.Dataset):
                ref = src["quant/" + name]
                if ref.dtype != obj.dtype or not np.array_equal(ref[()], obj[()]):
                    sys.exit(f"extract_golden: copy of quant/{name} differs from the oracle")
        dst["quant"].visititems(check)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", default=DEFAULT_ORACLE, help="the oracle's kernels.h5")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the golden file to write")
    args = parser.parse_args()
    if not os.path.exists(args.oracle):
        sys.exit(f"extract_golden: oracle file not found: {args.oracle}")
    sets = extract(args.oracle, args.out)
    print(f"wrote {os.path.relpath(args.out, REPO)}: {len(sets)} sets ({', '.join(sets)}), "
          f"{os.path.getsize(args.out)} bytes, sha256 {sha256(args.out)}")


if __name__ == "__main__":
    main()

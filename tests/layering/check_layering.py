#!/usr/bin/env python3
"""The dependency direction of dsv41 (docs/architecture.md), checked on every #include.

    formats -> ops -> model -> scenarios -> reports (+ golden, cuda)  ->  python

python/ (the Python module's bindings) sits on top of every layer, like scenarios/: it may include
any layer, and no file outside python/ may include a python/ header.

Each source file belongs to one layer; a file may include headers of its own layer and of the
layers it depends on, never of a layer above. In reference/, the component files (the ops: one
equation each, tensors in and tensors out) may include only formats/ and other ops-layer
headers: no model state, no hooks, no safetensors. The seam (reference/ops.h and its reference
implementation) sees the ops and the weights; the model sees everything below it.

Usage: check_layering.py SOURCE_DIR   (exit 0: clean; 1: prints every violation)
       check_layering.py --selftest      (the check catches a planted violation of each kind)
"""
import pathlib
import re
import sys

# reference/: which layer each file stem belongs to.
OPS_BASE = {"tensor", "dtype", "config", "config_rules", "numerics", "pcg64", "crc32c", "topk",
            "cache_precision"}
OPS_COMPONENTS = {"linear", "rmsnorm", "rope", "attention", "compressor", "indexer", "mhc", "mhc_budget", "engram",
                  "moe", "embedding", "kv_quant", "dspark", "sampling"}
WEIGHTS_IO = {"safetensors", "weights"}           # the checkpoint: what ops.h's prepare() sees
SEAM = {"ops", "reference_ops"}
MODEL = {"hooks", "kv_cache", "forward", "forward_attention", "model", "model_dspark", "byte_accounting",
         "speculative", "state_diff",
         "session_store", "session_internal", "session_codec", "session_restore", "session_file"}

# What each group may include (folder prefixes, or "reference:<set name>").
ALLOWED = {
    "formats": ["formats/"],
    "ops": ["formats/", "reference:base", "reference:components"],
    "weights": ["formats/", "reference:base", "reference:components", "reference:weights"],
    "seam": ["formats/", "reference:base", "reference:components", "reference:weights", "reference:seam"],
    "model": ["formats/", "reference:base", "reference:components", "reference:weights", "reference:seam",
              "reference:model"],
    # cuda/: kernels see formats/; the ops table (cuda/cuda_ops.*) implements the seam, so cuda/
    # sees what the seam sees (never the model: kv_cache, hooks, sessions).
    "cuda": ["formats/", "cuda/", "reference:base", "reference:components", "reference:weights", "reference:seam"],
    "reports": ["formats/", "reports/"],
    "golden": ["formats/", "golden/", "reports/h5_io.h"],
}
REF_SETS = {"base": OPS_BASE, "components": OPS_COMPONENTS, "weights": WEIGHTS_IO, "seam": SEAM,
            "model": MODEL}


def group_of(rel: pathlib.PurePosixPath):
    top = rel.parts[0]
    if top == "python":
        return None  # the top: may include any layer

    if top in ("formats", "cuda", "reports", "golden"):
        return top
    if top != "reference":
        return None  # scenarios/, tests/, bench/: may include any layer
    stem = rel.stem
    for name, members in (("ops", OPS_BASE | OPS_COMPONENTS), ("weights", WEIGHTS_IO), ("seam", SEAM),
                          ("model", MODEL)):
        if stem in members:
            return name
    return "unclassified"


def allowed(group: str, include: str) -> bool:
    for rule in ALLOWED[group]:
        if rule.startswith("reference:"):
            inc = pathlib.PurePosixPath(include)
            if inc.parts[0] == "reference" and inc.stem in REF_SETS[rule.split(":", 1)[1]]:
                return True
        elif include == rule or (rule.endswith("/") and include.startswith(rule)):
            return True
    return False


def selftest() -> int:
    """Plants one violation of each kind in a scratch tree: each must be reported."""
    import tempfile
    cases = {
        "reference/linear.h": "reference/model.h",          # a component reaching up into the model
        "reference/indexer.cc": "reference/safetensors.h",  # a component reading checkpoint types
        "reference/ops.h": "reference/hooks.h",             # the seam seeing hooks
        "formats/packed.h": "reference/tensor.h",           # formats depending on the reference
        "golden/golden_io.cc": "reports/report.h",          # golden above its one reports header
        "reference/new_thing.cc": "formats/base.h",         # a file of no layer
        "cuda/cuda_ops.cc": "reference/kv_cache.h",         # the CUDA ops table reaching into the model
        "scenarios/conform.cc": "python/bindings.h",        # a layer below reaching up into the Python module
    }
    failures = 0
    for file, include in cases.items():
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d, file)
            path.parent.mkdir(parents=True)
            path.write_text(f'#include "{include}"\n')
            found = check(pathlib.Path(d))
            if len(found) != 1:
                print(f"selftest: {file} including {include}: {len(found)} problems reported, want 1")
                failures += 1
    with tempfile.TemporaryDirectory() as d:  # and a clean file passes
        pathlib.Path(d, "reference").mkdir()
        pathlib.Path(d, "reference/linear.h").write_text('#include "reference/tensor.h"\n#include "formats/qdq.h"\n')
        pathlib.Path(d, "cuda").mkdir()  # the CUDA ops table implementing the seam
        pathlib.Path(d, "cuda/cuda_ops.h").write_text('#include "reference/ops.h"\n#include "cuda/kernels.h"\n')
        if check(pathlib.Path(d)):
            print("selftest: a clean component or the CUDA ops table was reported")
            failures += 1
    print(f"layering selftest: {len(cases) + 1 - failures} of {len(cases) + 1} cases right")
    return 1 if failures else 0


def check(root: pathlib.Path):
    problems = []
    for path in sorted(root.glob("*/**/*")):
        if path.suffix not in (".h", ".cc", ".cu", ".cuh") or "build" in path.parts[len(root.parts)]:
            continue
        rel = pathlib.PurePosixPath(path.relative_to(root).as_posix())
        group = group_of(rel)
        if group is None:
            if rel.parts[0] == "python":
                continue
            group = "any"  # scenarios/, tests/, bench/: any layer, but not python/
        if group == "unclassified":
            problems.append(f"{rel}: not assigned to a layer in tests/layering/check_layering.py")
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m and group == "any" and m.group(1).startswith("python/"):
                problems.append(f"{rel}:{n}: includes \"{m.group(1)}\" (python/ is the top: nothing includes it)")
            elif m and group != "any" and not allowed(group, m.group(1)):
                problems.append(f"{rel}:{n}: the {group} layer includes \"{m.group(1)}\" (a layer above it)")
    return problems


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--selftest":
        return selftest()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    checked = sum(1 for p in root.glob("*/**/*") if p.suffix in (".h", ".cc", ".cu", ".cuh")
                  and group_of(pathlib.PurePosixPath(p.relative_to(root).as_posix())) is not None)
    for p in problems:
        print(p)
    print(f"layering: {checked} files checked, {len(problems)} problem(s)")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

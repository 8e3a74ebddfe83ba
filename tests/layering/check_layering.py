#!/usr/bin/env python3
"""The dependency direction of dsv41 (docs/architecture.md, "Folders"), checked on every #include.

Every library folder is one subsystem; a file may include headers of its own folder and of the
folders below it (ALLOWED), never of a folder above. The floors, bottom first:

    base -> formats, h5 -> reference/{ops -> checkpoint -> seam -> model -> session}, reports, golden
         -> cuda (kernels see formats; the CUDA ops table implements the seam, never the model)
         -> scenarios/{judge, defects -> runner -> conform (-> agree -> selftest), vectors, exact -> selftest, sweep -> cli}
         -> python

python/ sits on top of every layer: it may include any, and nothing outside it includes python/.
tests/, bench/, fuzz/ and examples/ may include any library folder (not python/).
A library file in a folder the table does not know is reported (a new folder needs a row).

Usage: check_layering.py SOURCE_DIR   (exit 0: clean; 1: prints every violation)
       check_layering.py --selftest      (the check catches a planted violation of each kind)
"""
import pathlib
import re
import sys

_REF = ["reference/ops/", "reference/checkpoint/", "reference/seam/", "reference/model/", "reference/session/"]
_BELOW_SCENARIOS = ["base/", "formats/", "h5/", "reports/", "golden/", "cuda/"] + _REF

# What each folder may include (folder prefixes, or exact header paths).
ALLOWED = {
    "base/": ["base/"],
    "formats/": ["base/", "formats/"],
    "h5/": ["base/", "h5/"],
    "reference/ops/": ["base/", "formats/", "reference/ops/"],
    "reference/checkpoint/": ["base/", "formats/"] + _REF[:2],
    "reference/seam/": ["base/", "formats/"] + _REF[:3],
    "reference/model/": ["base/", "formats/"] + _REF[:4],
    "reference/session/": ["base/", "formats/"] + _REF,
    # cuda/: kernels see formats/; the ops table (cuda/cuda_ops.*) implements the seam, so cuda/
    # sees what the seam sees (never the model: kv_cache, hooks, sessions).
    "cuda/": ["base/", "formats/", "cuda/"] + _REF[:3],
    "reports/": ["base/", "formats/", "h5/", "reports/"],
    "golden/": ["base/", "golden/", "h5/"],
    "scenarios/judge/": _BELOW_SCENARIOS + ["scenarios/judge/"],
    "scenarios/defects/": _BELOW_SCENARIOS + ["scenarios/defects/"],
    "scenarios/runner/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/defects/", "scenarios/runner/"],
    "scenarios/conform/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/defects/", "scenarios/runner/",
                                              "scenarios/conform/"],
    "scenarios/vectors/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/vectors/"],
    # agree/ imports official runs as port dumps (official_dump.h): it writes them with conform's writer.
    "scenarios/agree/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/defects/", "scenarios/runner/",
                                            "scenarios/conform/", "scenarios/agree/"],
    "scenarios/exact/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/exact/"],
    # selftest/'s calibration judges the official runs as ports (agree/official_dump.h).
    "scenarios/selftest/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/defects/", "scenarios/runner/",
                                               "scenarios/conform/", "scenarios/agree/", "scenarios/selftest/"],
    "scenarios/sweep/": _BELOW_SCENARIOS + ["scenarios/judge/", "scenarios/defects/", "scenarios/runner/",
                                            "scenarios/sweep/"],
    "scenarios/cli/": _BELOW_SCENARIOS + ["scenarios/"],
}
FREE = ("tests", "bench", "fuzz", "examples")  # may include any library folder, not python/


def group_of(rel: pathlib.PurePosixPath):
    """The ALLOWED key of a file, None for a free folder or python/, "unclassified" otherwise."""
    top = rel.parts[0]
    if top == "python" or top in FREE:
        return None
    path = rel.as_posix()
    for key in sorted(ALLOWED, key=len, reverse=True):
        if path.startswith(key):
            return key
    return "unclassified"


def allowed(group: str, include: str) -> bool:
    return any(include == rule or (rule.endswith("/") and include.startswith(rule)) for rule in ALLOWED[group])


def selftest() -> int:
    """Plants one violation of each kind in a scratch tree: each must be reported."""
    import tempfile
    cases = {
        "reference/ops/linear.h": "reference/model/model.h",            # a component reaching up into the model
        "reference/ops/indexer.cc": "reference/checkpoint/safetensors.h",  # a component reading checkpoint types
        "reference/seam/ops.h": "reference/model/hooks.h",              # the seam seeing hooks
        "formats/packed.h": "reference/ops/tensor.h",                   # formats depending on the reference
        "base/error.h": "formats/packed.h",                             # the base depending on a codec
        "golden/golden_io.cc": "reports/report.h",                      # golden above the HDF5 layer
        "h5/h5_io.cc": "reports/table.h",                               # the HDF5 layer reaching into reports
        "reference/new_layer/thing.cc": "base/base.h",                  # a folder of no layer
        "cuda/cuda_ops.cc": "reference/model/kv_cache.h",               # the CUDA ops table reaching into the model
        "scenarios/conform/conform.cc": "python/bindings.h",            # a layer below reaching into python/
        "scenarios/runner/runner.cc": "scenarios/conform/conform.h",    # the runner above conform
        "scenarios/defects/mutants.cc": "scenarios/runner/capture.h",   # planted defects above the runner
        "scenarios/sweep/sweep.cc": "scenarios/cli/cli.h",              # a library reaching into the verbs
        "tests/x_test.cc": "python/bindings.h",                         # a test including python/
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
    with tempfile.TemporaryDirectory() as d:  # and clean files pass
        for file, include in {"reference/ops/linear.h": "reference/ops/tensor.h",
                              "cuda/cuda_ops.h": "reference/seam/ops.h",
                              "scenarios/conform/conform.cc": "scenarios/runner/capture.h",
                              "scenarios/cli/cli_run.cc": "scenarios/sweep/sweep.h"}.items():
            pathlib.Path(d, file).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(d, file).write_text(f'#include "{include}"\n#include "base/error.h"\n')
        if check(pathlib.Path(d)):
            print("selftest: a clean include was reported: " + "; ".join(check(pathlib.Path(d))))
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
        if group is None and rel.parts[0] == "python":
            continue
        if group == "unclassified":
            problems.append(f"{rel}: not in a folder of tests/layering/check_layering.py's table")
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            if group is None:
                if inc.startswith("python/"):
                    problems.append(f"{rel}:{n}: includes \"{inc}\" (python/ is the top: nothing includes it)")
            elif not allowed(group, inc):
                problems.append(f"{rel}:{n}: {group} includes \"{inc}\" (a folder above it or beside it)")
    return problems


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--selftest":
        return selftest()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    checked = sum(1 for p in root.glob("*/**/*") if p.suffix in (".h", ".cc", ".cu", ".cuh")
                  and "build" not in p.parts[len(root.parts)]
                  and pathlib.PurePosixPath(p.relative_to(root).as_posix()).parts[0] != "python")
    for p in problems:
        print(p)
    print(f"layering: {checked} files checked, {len(problems)} problem(s)")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs a pytest suite of the dsv41 Python module for CTest (tests/python/CMakeLists.txt).

    run_pytest.py [--needs MODULE ...] -- PYTEST_ARGS...

Exit 77 (CTest: skipped) only when a dependency is truly absent: pytest, numpy, h5py or a module
named by --needs (torch for the example port) cannot be imported, or the module was not built
(DSV41_PYTHON OFF: pybind11 not found). scripts/setup.sh installs all of them, so in CI the suites
run. Otherwise pytest's own exit code.
"""
import importlib
import os
import sys


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    opts, args = argv[:split], argv[split + 1:]
    needs = ["pytest", "numpy", "h5py"]
    i = 0
    while i < len(opts):
        if opts[i] == "--needs":
            needs.append(opts[i + 1])
            i += 2
        elif opts[i] == "--not-built":
            print(f"SKIPPED: the dsv41 Python module is not built ({opts[i + 1]})")
            return 77
        else:
            print(f"run_pytest.py: unknown option {opts[i]}", file=sys.stderr)
            return 2
    for mod in needs:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            print(f"SKIPPED: {mod} is not installed ({e}); scripts/setup.sh installs it")
            return 77
    import dsv41  # noqa: F401  (must import: the module was built)
    import pytest
    print(f"dsv41 module {dsv41.__file__}, python {sys.version.split()[0]}, PYTHONPATH={os.environ.get('PYTHONPATH')}")
    return pytest.main(["-p", "no:cacheprovider", "-q"] + args)


if __name__ == "__main__":
    sys.exit(main())

"""The dsv41 module's own tests (python/tests, registered in CTest: tests/python/CMakeLists.txt)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.path.join(ROOT, "golden", "oracle")
CONFIG = os.path.join(ORACLE, "config.json")
WEIGHTS = os.path.join(ORACLE, "weights.safetensors")


def dsv41_binary():
    """The `dsv41` binary the CLI tests run: DSV41_BIN (CTest sets it), else `dsv41` on PATH, else
    build/dsv41 beside the imported package (build/python/dsv41 -> build/dsv41); "" when none exists."""
    import shutil

    import dsv41

    env = os.environ.get("DSV41_BIN")
    if env:
        return env
    found = shutil.which("dsv41")
    if found:
        return found
    exe = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(dsv41.__file__)))), "dsv41")
    return exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else ""


NO_BINARY = "no dsv41 binary: DSV41_BIN unset, none on PATH, none at build/dsv41 beside the dsv41 package"

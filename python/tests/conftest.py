"""The dsv41 module's own tests (python/tests, registered in CTest: tests/python/CMakeLists.txt)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.path.join(ROOT, "golden", "oracle")
CONFIG = os.path.join(ORACLE, "config.json")
WEIGHTS = os.path.join(ORACLE, "weights.safetensors")

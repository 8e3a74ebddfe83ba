"""The `dsv41` console script of a pip install (pyproject.toml): runs the executable packaged
beside the module (dsv41/bin/dsv41) with the same arguments, exit code and streams."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dsv41")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"dsv41: error: the packaged executable {exe} is missing (reinstall: pip install .)\n")
        return 2
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

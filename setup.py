"""The CMake side of `pip install .` (pyproject.toml; docs/install.md).

One extension, dsv41._core, is "built" by configuring and building the CMake project (targets
dsv41 and dsv41_python: the module and the executable); beside the module go the executable
(dsv41/bin/dsv41, run by the `dsv41` console script) and the built-in data (dsv41/data: the tiny
oracle model, the official runs, the configs), which base/data_dir.h finds relative to either.

Environment:
  DSV41_PIP_BUILD_DIR   the CMake build folder (default: build-pip in the source tree); one that is
                        already configured is built as it is (no reconfigure: CI reuses its test
                        build this way)
  DSV41_CMAKE_ARGS      more arguments for the configure step (e.g. -DDSV41_ENABLE_CUDA=OFF)
  DSV41_BUILD_JOBS      parallel jobs (default: the machine's cores)
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
DATA = [  # (source, destination under dsv41/data)
    ("golden/oracle", "golden/oracle"),
    ("golden/runs", "golden/runs"),
    ("scenarios/configs", "scenarios/configs"),
    ("scenarios/scale", "scenarios/scale"),
]


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.abspath(os.environ.get("DSV41_PIP_BUILD_DIR") or os.path.join(ROOT, "build-pip"))
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            cmd = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DDSV41_BUILD_TESTS=OFF",
                   "-DDSV41_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            cmd += shlex.split(os.environ.get("DSV41_CMAKE_ARGS", ""))
            subprocess.run(cmd, check=True)
        jobs = os.environ.get("DSV41_BUILD_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", build, "-j", jobs, "--target", "dsv41", "dsv41_python"], check=True)

        dest = os.path.abspath(self.get_ext_fullpath(ext.name))  # .../dsv41/_core.<suffix>
        pkg = os.path.dirname(dest)
        os.makedirs(pkg, exist_ok=True)
        built = os.path.join(build, "python", "dsv41")
        cores = [f for f in os.listdir(built) if f.startswith("_core") and f.endswith(".so")]
        if len(cores) != 1:
            sys.exit(f"setup.py: expected one _core*.so in {built}, found {cores}")
        shutil.copy2(os.path.join(built, cores[0]), dest)
        source_pkg = os.path.join(ROOT, "python", "dsv41")
        editable = getattr(self, "editable_mode", False) or self.inplace
        for d in [pkg] + ([source_pkg] if editable else []):  # editable: the package is the source folder
            os.makedirs(os.path.join(d, "bin"), exist_ok=True)
            shutil.copy2(os.path.join(build, "dsv41"), os.path.join(d, "bin", "dsv41"))
        if editable:
            return  # the module in python/dsv41 reads the source tree's data (base/data_dir.h)
        for src, dst in DATA:
            target = os.path.join(pkg, "data", dst)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(ROOT, src), target)


# setuptools' own build folder would be build/, the CMake build folder of scripts/test.sh: moved aside.
setup(ext_modules=[CMakeExtension("dsv41._core")], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": os.path.join("build-pip", "setuptools")}})

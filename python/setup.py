"""Builds the weightcast package with the project's CMake build (only the module's targets).

    pip install ./python            # from the repository root

The extension is configured with the interpreter running pip (Python3_EXECUTABLE), so the
module matches its ABI. CMAKE_ARGS (environment) adds configure options, e.g.
CMAKE_ARGS="-DWEIGHTCAST_WITH_NCCL=OFF".
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent  # the repository root, whose CMakeLists.txt builds everything


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve() / "cmake"
        configure = [
            "cmake",
            "-S",
            str(SOURCE),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DWEIGHTCAST_BUILD_TESTS=OFF",
            "-DWEIGHTCAST_WITH_PYTHON=ON",
            f"-DPython3_EXECUTABLE={sys.executable}",
            *shlex.split(os.environ.get("CMAKE_ARGS", "")),
        ]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "--target", "_weightcast", "-j", jobs], check=True)
        built = next((build / "python" / "weightcast").glob("_weightcast*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


setup(
    packages=["weightcast"],
    ext_modules=[Extension("weightcast._weightcast", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)

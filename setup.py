"""Builds embedlog's Cython extension modules from pyx/ (which mirrors the package path).

EMBEDLOG_DEBUG=1 turns bounds checks back on and builds with -O0 -g;
EMBEDLOG_SANITIZE=1 builds with AddressSanitizer and UndefinedBehaviorSanitizer (any UB
report aborts), for tools/sanitize.py (`make test-asan`);
EMBEDLOG_ANNOTATE=1 writes Cython's HTML annotation next to each module.
"""
import os
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("EMBEDLOG_DEBUG") == "1"
HERE = Path(__file__).parent
PYX = HERE / "pyx"

directives = {"language_level": 3, "boundscheck": DEBUG, "wraparound": DEBUG,
              "cdivision": True, "initializedcheck": DEBUG, "embedsignature": True}
SANITIZE = os.environ.get("EMBEDLOG_SANITIZE") == "1"
cflags = ["-O0", "-g"] if DEBUG else ["-O3"]
ldflags = []
if SANITIZE:
    sanitizers = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    cflags = ["-O1", "-g", "-fno-omit-frame-pointer"] + sanitizers
    ldflags = sanitizers
if sys.platform.startswith("linux"):
    cflags.append("-Wno-unused-function")

extensions = [
    Extension(
        f"embedlog._native.{path.stem}",
        [str(path.relative_to(HERE))],
        include_dirs=[str(PYX / "embedlog" / "_native"), numpy.get_include()],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for path in sorted((PYX / "embedlog" / "_native").glob("*.pyx"))
]

# Cython and the C compiler run one job per core (build_ext -j N still says otherwise).
# EMBEDLOG_NO_EXT=1 builds no module: the Makefile's editable install leaves them to one
# `setup.py build_ext --inplace`, which keeps its objects in build/ and skips what is current.
JOBS = os.cpu_count() or 1
setup(
    ext_modules=[] if os.environ.get("EMBEDLOG_NO_EXT") == "1" else cythonize(
        extensions, include_path=[str(PYX)], compiler_directives=directives, nthreads=JOBS,
        annotate=os.environ.get("EMBEDLOG_ANNOTATE") == "1"),
    options={"build_ext": {"parallel": JOBS}},
)

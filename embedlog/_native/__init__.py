"""Compiled Cython modules built from pyx/embedlog/_native.

There is no pure-Python fallback: without the build, importing embedlog fails.
"""
try:
    from embedlog._native import format  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by tests/test_import.py in a subprocess
    raise ImportError(
        "embedlog's compiled extension modules are missing or broken "
        f"({exc}). Build them with `pip install .` (or `python setup.py build_ext --inplace` "
        "in a source checkout); embedlog has no pure-Python fallback."
    ) from exc

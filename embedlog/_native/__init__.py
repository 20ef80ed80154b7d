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

# pymalloc's free arenas are kept for reuse (arenas.pyx says why); EMBEDLOG_ARENA_CACHE_MB=0
# leaves CPython's own behaviour
import os as _os  # noqa: E402

from embedlog._native import arenas as _arenas  # noqa: E402

try:
    _arena_cache_mb = int(_os.environ.get("EMBEDLOG_ARENA_CACHE_MB", "64"))
except ValueError:
    raise ImportError("EMBEDLOG_ARENA_CACHE_MB is a number of MiB, got "
                      f"{_os.environ['EMBEDLOG_ARENA_CACHE_MB']!r}") from None
_arenas.install(max(0, _arena_cache_mb) << 20)

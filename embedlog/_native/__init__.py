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

_arena_cache = _os.environ.get("EMBEDLOG_ARENA_CACHE_MB", "64")
if not _arena_cache.strip().isdigit():       # a bad setting is an error, not 0 or 64
    from embedlog.errors import ConfigError  # noqa: E402
    raise ConfigError(f"EMBEDLOG_ARENA_CACHE_MB is a number of MiB (0 or more), got {_arena_cache!r}")
_arenas.install(int(_arena_cache) << 20)

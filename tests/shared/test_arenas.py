"""The cache of pymalloc's free arenas (embedlog/_native/arenas.pyx)."""
import os
import subprocess
import sys

import pytest

from embedlog._native import arenas


def churn(mib: int) -> None:
    """Make and drop about ``mib`` MiB of small objects (pymalloc's, in its arenas)."""
    items = [bytes(100) for _ in range(mib * 8000)]
    del items


def test_freed_arenas_are_given_out_again_up_to_the_limit():
    before = arenas.stats()
    churn(40)
    churn(40)
    after = arenas.stats()
    assert after["limit"] == 64
    assert after["hits"] - before["hits"] >= 20        # the second churn reused the first's
    assert 0 < after["kept_bytes"] <= 64 << 20


def test_a_lower_limit_gives_the_surplus_back():
    churn(40)
    try:
        arenas.install(2 << 20)
        assert arenas.stats()["kept"] <= 2
        churn(40)
        assert arenas.stats()["kept"] <= 2
    finally:
        arenas.install(64 << 20)


def run(env_value: str) -> subprocess.CompletedProcess:
    code = ("from embedlog._native import arenas\n"
            "items = [bytes(100) for _ in range(400000)]; del items\n"
            "items = [bytes(100) for _ in range(400000)]; del items\n"
            "print(arenas.stats())")
    env = dict(os.environ, EMBEDLOG_ARENA_CACHE_MB=env_value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_zero_leaves_cpythons_own_behaviour():
    out = run("0")
    assert out.returncode == 0, out.stderr
    stats = eval(out.stdout)
    assert stats["limit"] == 0 and stats["hits"] == 0 and stats["kept"] == 0


@pytest.mark.parametrize("value", ["lots", "-5", "", "1.5"])
def test_a_bad_value_is_a_clear_config_error(value):
    out = run(value)
    assert out.returncode != 0
    assert "embedlog.errors.ConfigError: EMBEDLOG_ARENA_CACHE_MB is a number of MiB (0 or " \
        f"more), got {value!r}" in out.stderr

"""Test session setup: the compiled extension must load (there is no fallback)."""
import os
import signal
import sys

import pytest
# Imported now, in the main thread, rather than by hypothesis's plugin at the end of the
# session: pytest rewrites plugin packages with ast.parse, and CPython 3.11.7's AST
# bookkeeping is shared between threads, so a late import while other threads live has
# failed the whole run with "SystemError: AST constructor recursion depth mismatch".
import hypothesis  # noqa: F401,E402
import hypothesis.internal.observability  # noqa: F401,E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_sessionstart(session):
    # a suite started in the background by a shell (`make test &`, nohup) inherits SIGINT
    # ignored, and so would every process a test starts: the Ctrl-C tests (cluster up, demo)
    # would wait forever. Python's own handler here means children start with the default
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        import embedlog._native.format  # noqa: F401
        import embedlog._native.journal_format  # noqa: F401
        import embedlog._native.journal_buffer  # noqa: F401
        import embedlog._native.journal_waiters  # noqa: F401
        import embedlog._native.journal_scan  # noqa: F401
        import embedlog._native.journal_kernels  # noqa: F401
        import embedlog._native.memtable  # noqa: F401
        import embedlog._native.entrylog  # noqa: F401
        import embedlog._native.index  # noqa: F401
    except ImportError as exc:
        pytest.exit(f"embedlog's Cython extension did not load: {exc}", returncode=3)
    # bookies under test keep spare journals and run major compaction only below
    # disk_usage_warn_threshold of the temporary directory's disk: past it those tests
    # would fail for the machine, not the code (stale scratch data once took it to 95%)
    import tempfile
    from embedlog.bookie.disks import disk_usage
    from embedlog.config import BookieConfig
    usage = disk_usage(tempfile.gettempdir())[0]
    limit = BookieConfig().disk_usage_warn_threshold - 0.05
    if usage >= limit:
        why = (f"the disk of {tempfile.gettempdir()} is {usage:.0%} used: the tests need it "
               f"below {limit:.0%} (bookies keep spare journals and compact only below "
               "disk_usage_warn_threshold); free some space")
        from embedlog.harness.servers import in_ci
        if in_ci():
            pytest.exit(why, returncode=3)
        import warnings
        warnings.warn(why)


@pytest.fixture
def own_zookeeper():
    """A ZooKeeper server of the test's own, stopped after it (a test that restores it from
    a backup, or whose root must start empty). Missing ZooKeeper fails under CI=true."""
    from support.servers import ServerMissing, ZooKeeperServer, skip_unless_ci
    try:
        server = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    yield server
    server.stop()


@pytest.fixture
def any_disk_is_quick(monkeypatch):
    """Journal.sync_if_idle syncs on its caller's thread only while fdatasync took under
    SYNC_HERE_MAX_S lately; a loaded machine's can take longer. For tests of that path."""
    from embedlog.bookie import journal
    monkeypatch.setattr(journal, "SYNC_HERE_MAX_S", 60.0)


@pytest.fixture
def small_config():
    """One small configuration for storage tests: small memtable and logs, quick checkpoints."""
    return dict(skip_list_size_limit=1 << 20, entry_log_size_limit=4 << 20,
                journal_max_size_mb=4, journal_pre_alloc_size_mb=1, flush_interval_ms=200)

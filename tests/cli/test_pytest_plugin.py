"""The shipped pytest plugin, used the way an application's test suite would use it."""
import os
import subprocess
import sys
import textwrap

import embedlog


def test_plugin_fixtures_in_a_user_suite(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        def test_embedded(embedlog_log):
            w = embedlog_log.create_ledger()
            assert w.append(b"x") == 0

        def test_cluster(embedlog_cluster):
            c = embedlog_cluster.client()
            w = c.create_ledger(3, 2, 2)
            w.append(b"y")
            embedlog_cluster.kill_bookie(0)
            embedlog_cluster.restart_bookie(0)
            w.close()
            assert c.open_ledger(w.ledger_id).read_entry(0) == b"y"
    """))
    from importlib.metadata import entry_points
    installed = any(ep.name == "embedlog" for ep in entry_points(group="pytest11"))
    load = [] if installed else ["-p", "embedlog.pytest_plugin"]   # installed: the entry point loads it
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", *load,
                          "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [os.path.dirname(os.path.dirname(embedlog.__file__)),
                              os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout

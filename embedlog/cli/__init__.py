"""The `embedlog` command (docs/ARCHITECTURE.md's top layer but Spark): one module per command group.

    commands.py     the `embedlog` group: demo, bookie serve, cluster up, bench
    common.py       what every subcommand shares: exit codes, errors, --json, ledger ids
    config.py       `embedlog config show|keys`; config_file.py the effective configuration
    ledger.py       `embedlog ledger ...`
    stream.py       `embedlog stream ...`
    shell.py        `embedlog shell ...`: a bookie's files
    demo.py         `embedlog demo`: the main job on the embedded default

`python -m embedlog.cli` and the `embedlog` console script (``embedlog.cli:main``) run it.
"""
from __future__ import annotations

__all__ = ["main"]


def __getattr__(name):
    # `main` (and with it every command group and click) loads on first use, so that
    # `embedlog.cli.config_file` stays cheap to import for the fuzzers
    if name == "main":
        from embedlog.cli.commands import main
        return main
    raise AttributeError(f"module 'embedlog.cli' has no attribute {name!r}")

"""The `embedlog` command."""
from __future__ import annotations

import sys
import tempfile

import click

from embedlog.errors import EmbedlogError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="embedlog")
def main():
    """embedlog: Apache BookKeeper's bookie, embedded in a Python process."""


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Fresh directory for the log (default: a new temporary one).")
@click.option("--entries", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Entries to write.")
@click.option("--ledgers", type=click.IntRange(min=1, max=10_000), default=8, show_default=True,
              help="Ledgers to spread them over.")
@click.option("--seed", type=int, default=1, show_default=True)
def demo(directory, entries, ledgers, seed):
    """Write, SIGKILL, reopen, verify and read back an embedded log; print figures."""
    from embedlog.demo import run
    directory = directory or tempfile.mkdtemp(prefix="embedlog-demo-")
    try:
        run(directory, ledgers=ledgers, entries=entries, seed=seed)
    except EmbedlogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@main.command()
@click.option("--quick", is_flag=True, help="Small sizes (a smoke run).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Also write the results table (markdown) here.")
def bench(quick, out):
    """Run the comparison benchmark (embedlog against SQLite, LMDB, RocksDB, a plain file)."""
    import os
    import runpy
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "benchmarks", "compare.py")
    if not os.path.exists(script):
        raise click.ClickException("benchmarks/compare.py is not here (run from a source checkout)")
    sys.argv = [script] + (["--quick"] if quick else []) + (["--out", out] if out else [])
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

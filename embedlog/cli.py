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


@main.group()
def bookie():
    """Run and inspect bookies."""


def _config_pairs(pairs):
    """--set key=value pairs as typed configuration values."""
    from embedlog.config import BookieConfig
    from embedlog.errors import ConfigError
    keys = BookieConfig.keys()
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in keys:
            raise ConfigError(f"--set wants KEY=VALUE with a known key, got {pair!r}")
        kind = type(keys[key].default)
        if kind is bool:
            out[key] = value.lower() in ("1", "true", "yes", "on")
        else:
            try:
                out[key] = kind(value)
            except ValueError:
                raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}") from None
    return out


@bookie.command("serve")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The bookie's directory (created if missing).")
@click.option("--listen", default="127.0.0.1:3181", show_default=True, help="HOST:PORT to listen on.")
@click.option("--advertised-address", default=None, help="HOST:PORT clients should use (default: --listen).")
@click.option("--metadata", "metadata_uri", default=None,
              help="Metadata service URI (default: the directory's own sqlite:///DIR/meta.db).")
@click.option("--read-only", is_flag=True, help="Start read-only (adds are refused).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="A configuration key.")
@click.option("--autorecovery/--no-autorecovery", default=False, show_default=True,
              help="Run the auditor election and a replication worker in this process.")
@click.option("--autorecovery-interval", type=float, default=1.0, show_default=True,
              help="Seconds between audits and replication rounds.")
@click.option("--lost-bookie-grace", type=float, default=10.0, show_default=True,
              help="Seconds a bookie may be unregistered before its ledgers are re-replicated.")
@click.option("--ready-file", default=None, hidden=True)
def bookie_serve(directory, listen, advertised_address, metadata_uri, read_only, settings,
                 autorecovery, autorecovery_interval, lost_bookie_grace, ready_file):
    """Serve one bookie over the wire protocol until SIGTERM or Ctrl-C."""
    from embedlog.net.serve import serve
    ar = (dict(interval_s=autorecovery_interval, lost_bookie_grace_s=lost_bookie_grace)
          if autorecovery else None)
    try:
        serve(directory, listen, advertised_address, metadata_uri, read_only,
              _config_pairs(settings), ready_file, ar)
    except EmbedlogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.group()
def cluster():
    """A local cluster of bookie processes."""


@cluster.command("up")
@click.option("--bookies", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--metadata", type=click.Choice(["sqlite", "zk", "etcd"]), default="sqlite", show_default=True)
@click.option("--dir", "base_dir", default=None, type=click.Path(file_okay=False),
              help="Where the bookies keep their data (default: a temporary directory).")
def cluster_up(bookies, metadata, base_dir):
    """Run a LocalCluster until interrupted, printing where each bookie listens."""
    import signal
    import threading
    from embedlog.harness import LocalCluster
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with LocalCluster(bookies=bookies, metadata=metadata, base_dir=base_dir) as lc:
        click.echo(f"metadata: {lc.metadata_uri}")
        for i in range(len(lc)):
            click.echo(f"bookie {i}: {lc.bookie_id(i)} at {lc.proxy(i).address} (dir {lc.bookie_dir(i)})")
        click.echo("Ctrl-C stops the cluster.", err=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


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

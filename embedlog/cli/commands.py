"""The `embedlog` command."""
from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import sys
import tempfile
import threading

import click
from rich.console import Console

from embedlog.cli import operate
from embedlog.cli.common import (METADATA_ENV, EmbedlogGroup, emit, install_common_options,
                                 json_option, log_level_option)
from embedlog.cli.config import config_options, effective
from embedlog.cli.demo import run
from embedlog.cli.ledger import ledger
from embedlog.cli.serve import serve
from embedlog.cli.shell import shell
from embedlog.cli.group import group
from embedlog.cli.stream import stream
from embedlog.errors import ConfigError
from embedlog.fileio import file_in_the_way
from embedlog.harness import LocalCluster


@click.group(cls=EmbedlogGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="embedlog")
@log_level_option
def main():
    """embedlog: Apache BookKeeper's bookie, embedded in a Python process.

    Every command takes --log-level (or EMBEDLOG_LOG_LEVEL) and exits 0 done, 1 failed,
    2 bad usage, 3 not found, 4 refused, 5 metadata store unreachable, 130 interrupted."""


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Fresh directory for the log (default: a new temporary one, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (its path is printed).")
@click.option("--entries", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Entries to write.")
@click.option("--ledgers", type=click.IntRange(min=1, max=10_000), default=8, show_default=True,
              help="Ledgers to spread them over.")
@click.option("--seed", type=int, default=1, show_default=True)
@json_option
def demo(directory, keep, entries, ledgers, seed, as_json):
    """Write, SIGKILL, reopen, verify and read back an embedded log; print figures.

    Progress goes to stderr, the figures to stdout. A directory the demo made is removed
    when it ends (Ctrl-C too: exit 130) unless --keep; a --dir you gave is kept."""
    made = directory is None
    directory = directory or tempfile.mkdtemp(prefix="embedlog-demo-")
    try:
        result = run(directory, ledgers=ledgers, entries=entries, seed=seed,
                     console=Console(stderr=True), out=None if as_json else Console())
    finally:
        if made and not keep:
            shutil.rmtree(directory, ignore_errors=True)
        elif made:
            click.echo(f"kept {directory}", err=True)
    if as_json:
        emit(True, {"directory": directory, "kept": keep or not made, **result})


@main.group(cls=EmbedlogGroup)
def bookie():
    """Run, list and administer bookies."""


@bookie.command("serve")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The bookie's directory (created if missing).")
@config_options
@click.option("--read-only", is_flag=True, help="Start read-only (adds are refused).")
@click.option("--autorecovery-interval", type=float, default=1.0, show_default=True,
              help="Seconds between audits and replication rounds.")
@click.option("--lost-bookie-grace", type=float, default=10.0, show_default=True,
              help="Seconds a bookie may be unregistered before its ledgers are re-replicated.")
@click.option("--ready-file", default=None, hidden=True)
@click.option("--parent-pid", type=int, default=None, hidden=True,
              help="Stop when this process is no longer the parent (LocalCluster's bookies).")
@click.option("--tls-cert-file", type=click.Path(dir_okay=False), default=None,
              help="Serve TLS with this certificate (PEM; may hold the key too).")
@click.option("--tls-key-file", type=click.Path(dir_okay=False), default=None,
              help="The certificate's private key (PEM), if not in --tls-cert-file.")
@click.option("--tls-ca-file", type=click.Path(dir_okay=False), default=None,
              help="Require client certificates signed by this CA (needs --tls-cert-file).")
@click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
              help="Require every connection to begin with AUTH carrying this file's token.")
def bookie_serve(directory, conf_path, settings, listen, advertised_address, metadata_uri, http_port,
                 autorecovery, read_only, autorecovery_interval, lost_bookie_grace, ready_file,
                 tls_cert_file, tls_key_file, tls_ca_file, auth_token_file, parent_pid):
    """Serve one bookie over the wire protocol until SIGTERM or Ctrl-C (exit 0).

    Configuration: defaults < --conf TOML file < EMBEDLOG_* environment < options
    (`embedlog config show` with the same options prints the result). Exit code 2 when
    it cannot start: an invalid configuration, a port in use, a directory it cannot use
    or that another process holds; 5 when the metadata store cannot be reached."""
    eff = effective(conf_path, settings, listen, advertised_address, metadata_uri, http_port,
                    autorecovery)
    v = eff.values
    ar = (dict(interval_s=autorecovery_interval, lost_bookie_grace_s=lost_bookie_grace)
          if v["auto_recovery_daemon_enabled"] else None)
    try:
        serve(directory, f"{v['listening_interface']}:{v['bookie_port']}",
              v["advertised_address"] or None, v["metadata_service_uri"] or None, read_only,
              v, ready_file, ar, tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
              tls_ca_file=tls_ca_file, auth_token_file=auth_token_file, parent_pid=parent_pid)
    except KeyboardInterrupt:          # Ctrl-C while starting (replaying the journal): a stop
        click.echo("interrupted while starting", err=True)


@main.group(cls=EmbedlogGroup)
def cluster():
    """A local cluster of bookie processes."""


@cluster.command("up")
@click.option("--bookies", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--metadata", type=click.Choice(["sqlite", "zk", "etcd"]), default="sqlite", show_default=True)
@click.option("--dir", "base_dir", default=None, type=click.Path(file_okay=False),
              help="Where the bookies keep their data (kept at the end; `cluster up --dir` "
                   "again serves it again). Default: a temporary directory, removed at the end.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory at the end (its path is printed).")
@click.option("--http/--no-http", default=False, show_default=True,
              help="Run each bookie's admin HTTP server (status page, metrics) on a free port.")
@click.option("--fault-proxies", is_flag=True,
              help="Put a fault proxy (LocalCluster's delay / drop / cut) in front of each "
                   "bookie, in this process: every byte then crosses it (several times slower). "
                   "Without it clients reach the bookies directly.")
@json_option
def cluster_up(bookies, metadata, base_dir, keep, http, fault_proxies, as_json):
    """Run a LocalCluster until interrupted (Ctrl-C or SIGTERM: exit 0), printing where each
    bookie listens and the `export EMBEDLOG_METADATA=...` line other shells need.

    A bookie that exits on its own (a crash, a signal) gets a line with its exit code or
    signal and its log's last lines (--json: a {"event": "bookie_exited", ...} line); the
    others keep running until Ctrl-C.

    With zk or etcd, ZooKeeper's or etcd's own data is throwaway: only the bookies'
    directories (and a sqlite store) can be kept."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = {"http_server_enabled": True, "http_server_port": 0} if http else None
    made = base_dir is None
    base_dir = os.path.abspath(base_dir or tempfile.mkdtemp(prefix="embedlog-cluster-"))
    if not made and file_in_the_way(base_dir) is not None:
        # refused before anything is made, and no "its data is in" a path that cannot be
        raise ConfigError(f"--dir {base_dir}: {file_in_the_way(base_dir)} is a file, not a directory")
    try:
        with LocalCluster(bookies=bookies, metadata=metadata, base_dir=base_dir,
                          bookie_config=config, proxies=fault_proxies) as lc:
            try:           # the cluster is up: Ctrl-C from here on stops it cleanly
                admin = {}
                if http:
                    with lc.client() as c:
                        rc = c.metadata.registration_client
                        admin = {r.bookie_id: (r.info or {}).get("http") for r in rc.get_all_bookies()}
                rows = [{"index": i, "bookie_id": lc.bookie_id(i), "address": lc.address(i),
                         "dir": lc.bookie_dir(i), "http": admin.get(lc.bookie_id(i))}
                        for i in range(len(lc))]
                if as_json:
                    click.echo(json.dumps({"metadata_uri": lc.metadata_uri, "dir": base_dir,
                                           "fault_proxies": fault_proxies, "bookies": rows}))
                else:
                    click.echo(f"metadata: {lc.metadata_uri}")
                    if fault_proxies:
                        click.echo("clients reach each bookie through a fault proxy in this process "
                                   "(--fault-proxies): slower than direct, for fault tests")
                    for r in rows:
                        extra = f", status page http://{r['http']}/status" if r["http"] else ""
                        click.echo(f"bookie {r['index']}: {r['bookie_id']} at {r['address']} "
                                   f"(dir {r['dir']}){extra}")
                    click.echo(f"export {METADATA_ENV}={lc.metadata_uri}")
                sys.stdout.flush()
                removal = ("is removed" if made and not keep else "is kept") + f" when it stops ({base_dir})"
                click.echo(f"Ctrl-C stops the cluster; its data {removal}.", err=True)
                while not stop.wait(WATCH_INTERVAL_S):
                    _say_crashed(lc, as_json)
            except KeyboardInterrupt:
                pass
    finally:
        if made and not keep:
            shutil.rmtree(base_dir, ignore_errors=True)
            click.echo(f"cluster stopped; removed {base_dir}", err=True)
        else:
            click.echo(f"cluster stopped; its data is in {base_dir}", err=True)


WATCH_INTERVAL_S = 0.2          # how often `cluster up` looks for a bookie that exited


def _say_crashed(lc: LocalCluster, as_json: bool) -> None:
    """A line (and its log's last lines) for each bookie that exited unasked. The cluster
    keeps running: the others still serve, and the dead one's data is there to look at."""
    for c in lc.crashed_bookies():
        running = sum(lc.is_running(i) for i in range(len(lc)))
        if as_json:
            click.echo(json.dumps({"event": "bookie_exited", "running": running, **c}))
        else:
            tail = "".join(f"    {line}\n" for line in c["log_tail"].splitlines())
            click.echo(f"bookie {c['index']} ({c['bookie_id']}) exited: {c['exit']}; "
                       f"{running} of {len(lc)} bookies still run; the end of {c['log']}:\n{tail}",
                       nl=False)
        sys.stdout.flush()


BENCH_SUITES = {"compare": "compare.py", "ingest": "ingest.py", "replication": "replication.py",
                "metadata": "bench_metadata.py"}


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--suite", type=click.Choice(sorted(BENCH_SUITES)), default="compare", show_default=True,
              help="Which benchmark: compare (embedlog against its peers), ingest, replication, metadata.")
@click.option("--quick", is_flag=True, help="Small sizes (a smoke run; compare only).")
@click.option("--only", default=None, metavar="ITEMS",
              help="compare: comma-separated work items to run (e.g. append_sync_100B).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="compare: also write the results table (markdown) here.")
@click.argument("suite_args", nargs=-1, type=click.UNPROCESSED)
def bench(suite, quick, only, out, suite_args):
    """Run a benchmark suite from benchmarks/; arguments after -- go to the suite
    (e.g. `embedlog bench --suite ingest -- --entries 100000`)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", BENCH_SUITES[suite])
    if not os.path.exists(script):
        raise ConfigError(f"benchmarks/{BENCH_SUITES[suite]} is not here (run from a source checkout)")
    if suite != "compare" and (quick or only or out):
        raise click.UsageError("--quick, --only and --out are for --suite compare; pass a suite's "
                               "own options after --")
    argv = list(suite_args)
    argv += (["--quick"] if quick else []) + (["--only", only] if only else []) + (["--out", out] if out else [])
    sys.argv = [script] + argv
    runpy.run_path(script, run_name="__main__")


def _add_commands():
    # each group lives in its own module; imported here so `embedlog --help` lists them
    from embedlog.cli.config import config
    for command_group in (config, ledger, stream, group, shell):
        main.add_command(command_group)
    operate.add_to(main, bookie)
    install_common_options(main)


_add_commands()

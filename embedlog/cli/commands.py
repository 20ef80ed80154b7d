"""The `embedlog` command."""
from __future__ import annotations

import sys
import tempfile

import click

from embedlog.cli.config import config_options
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
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (the table goes to stderr).")
def demo(directory, entries, ledgers, seed, as_json):
    """Write, SIGKILL, reopen, verify and read back an embedded log; print figures.

    Ctrl-C stops it (exit 130) and removes the directory if the demo made it."""
    import json
    import shutil
    from rich.console import Console
    from embedlog.cli.demo import run
    made = directory is None
    directory = directory or tempfile.mkdtemp(prefix="embedlog-demo-")
    try:
        result = run(directory, ledgers=ledgers, entries=entries, seed=seed,
                     console=Console(stderr=True) if as_json else None)
    except EmbedlogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        if made:
            shutil.rmtree(directory, ignore_errors=True)
        click.echo("interrupted", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps({"directory": directory, **result}))


@main.group()
def bookie():
    """Run and inspect bookies."""


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
                 tls_cert_file, tls_key_file, tls_ca_file, auth_token_file):
    """Serve one bookie over the wire protocol until SIGTERM or Ctrl-C (exit 0).

    Configuration: defaults < --conf TOML file < EMBEDLOG_* environment < options
    (`embedlog config show` with the same options prints the result). Exit code 2 when
    the configuration is invalid or the directory is held by another process."""
    from embedlog.cli.config import effective
    from embedlog.cli.serve import serve
    try:
        eff = effective(conf_path, settings, listen, advertised_address, metadata_uri, http_port,
                        autorecovery)
        v = eff.values
        ar = (dict(interval_s=autorecovery_interval, lost_bookie_grace_s=lost_bookie_grace)
              if v["auto_recovery_daemon_enabled"] else None)
        serve(directory, f"{v['listening_interface']}:{v['bookie_port']}",
              v["advertised_address"] or None, v["metadata_service_uri"] or None, read_only,
              v, ready_file, ar, tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
              tls_ca_file=tls_ca_file, auth_token_file=auth_token_file)
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
@click.option("--http/--no-http", default=False, show_default=True,
              help="Run each bookie's admin HTTP server (status page, metrics) on a free port.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON line (metadata URI, bookies) once the cluster is up.")
def cluster_up(bookies, metadata, base_dir, http, as_json):
    """Run a LocalCluster until interrupted (Ctrl-C or SIGTERM: exit 0), printing where each
    bookie listens."""
    import signal
    import threading
    from embedlog.harness import LocalCluster
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = {"http_server_enabled": True, "http_server_port": 0} if http else None
    with LocalCluster(bookies=bookies, metadata=metadata, base_dir=base_dir, bookie_config=config) as lc:
        if not as_json:
            click.echo(f"metadata: {lc.metadata_uri}")
        admin = {}
        if http:
            with lc.client() as c:
                rc = c.metadata.registration_client
                admin = {r.bookie_id: (r.info or {}).get("http")
                         for r in rc.get_all_bookies()}
        rows = [{"index": i, "bookie_id": lc.bookie_id(i), "address": lc.proxy(i).address,
                 "dir": lc.bookie_dir(i), "http": admin.get(lc.bookie_id(i))} for i in range(len(lc))]
        if as_json:
            import json
            click.echo(json.dumps({"metadata_uri": lc.metadata_uri, "bookies": rows}))
        else:
            for r in rows:
                extra = f", status page http://{r['http']}/status" if r["http"] else ""
                click.echo(f"bookie {r['index']}: {r['bookie_id']} at {r['address']} (dir {r['dir']}){extra}")
        sys.stdout.flush()
        click.echo("Ctrl-C stops the cluster.", err=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


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
    import os
    import runpy
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", BENCH_SUITES[suite])
    if not os.path.exists(script):
        raise click.ClickException(f"benchmarks/{BENCH_SUITES[suite]} is not here (run from a source checkout)")
    if suite != "compare" and (quick or only or out):
        raise click.UsageError("--quick, --only and --out are for --suite compare; pass a suite's "
                               "own options after --")
    argv = list(suite_args)
    argv += (["--quick"] if quick else []) + (["--only", only] if only else []) + (["--out", out] if out else [])
    sys.argv = [script] + argv
    try:
        runpy.run_path(script, run_name="__main__")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


def _add_commands():
    # each group lives in its own module; imported here so `embedlog --help` lists them
    from embedlog.cli.config import config
    from embedlog.cli.ledger import ledger
    from embedlog.cli.stream import stream
    from embedlog.cli.shell import shell
    for group in (config, ledger, stream, shell):
        main.add_command(group)


_add_commands()

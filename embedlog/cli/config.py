"""`embedlog config ...`: the effective configuration and the schema of every key."""
from __future__ import annotations

import click

from embedlog.cli.common import EmbedlogGroup, emit, json_option, table
from embedlog.cli.config_file import env_name, markdown_table, resolve, serve_options
from embedlog.config import BookieConfig


def config_options(f):
    """The options that set configuration keys, shared by `bookie serve` and `config show`."""
    opts = [
        click.option("--conf", "conf_path", type=click.Path(dir_okay=False), default=None,
                     help="TOML configuration file (default: $EMBEDLOG_CONF if set)."),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="A configuration key (repeatable); wins over file and environment."),
        click.option("--listen", default=None, metavar="HOST:PORT",
                     help="Where the bookie listens (keys listening_interface, bookie_port; "
                          "default 127.0.0.1:3181)."),
        click.option("--advertised-address", default=None, metavar="HOST:PORT",
                     help="HOST:PORT clients should use (default: the listening address)."),
        click.option("--metadata", "metadata_uri", default=None, metavar="URI",
                     help="Metadata service URI (key metadata_service_uri, env EMBEDLOG_METADATA; "
                          "default: the directory's own sqlite:///DIR/meta.db)."),
        click.option("--http-port", type=click.IntRange(0, 65535), default=None,
                     help="Turn the admin HTTP server on at this port (0: any free port)."),
        click.option("--autorecovery/--no-autorecovery", default=None,
                     help="Run the auditor election and a replication worker in this process "
                          "(key auto_recovery_daemon_enabled)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def effective(conf_path, settings, listen, advertised_address, metadata_uri, http_port, autorecovery):
    return resolve(conf_path, options=serve_options(
        settings=settings, listen=listen, advertised_address=advertised_address,
        metadata_uri=metadata_uri, http_port=http_port, autorecovery=autorecovery))


@click.group(cls=EmbedlogGroup)
def config():
    """Show the effective configuration and the documented keys."""


@config.command("show")
@config_options
@json_option
def config_show(conf_path, settings, listen, advertised_address, metadata_uri, http_port,
                autorecovery, as_json):
    """Print the configuration a bookie would run with, and where each value came from
    (default, file, env or option). Exits 2, naming the key, if a value is invalid."""
    eff = effective(conf_path, settings, listen, advertised_address, metadata_uri, http_port,
                    autorecovery)
    if as_json:
        emit(True, {"conf": eff.conf_path, "keys": eff.rows(), "unknown_env": eff.unknown_env})
        return
    def shown(value):
        # as TOML writes it, so a line can be pasted into a configuration file
        return (f'"{value}"' if isinstance(value, str) else str(value).lower()
                if isinstance(value, bool) else str(value))

    click.echo(f"configuration file: {eff.conf_path or '(none)'}")
    table(["key", "value", "source"], [[r["key"], shown(r["value"]), r["source"]] for r in eff.rows()])
    for name in eff.unknown_env:
        click.echo(f"warning: {name} is set but is no configuration key", err=True)


@config.command("keys")
@click.option("--markdown", is_flag=True, help="The table of docs/CONFIGURATION.md.")
@json_option
def config_keys(markdown, as_json):
    """Every configuration key with its default, range, environment variable and meaning."""
    if markdown:
        click.echo(markdown_table())
        return
    rows = [{"key": n, "default": f.default, "min": f.metadata["min"], "max": f.metadata["max"],
             "env": env_name(n), "doc": f.metadata["doc"]} for n, f in BookieConfig.keys().items()]
    if as_json:
        emit(True, rows)
        return
    for r in rows:
        rng = f" [{r['min']}..{r['max']}]" if r["min"] is not None else ""
        click.echo(f"{r['key']} = {r['default']!r}{rng}  ({r['env']})\n    {r['doc']}")

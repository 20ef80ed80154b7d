"""What every `embedlog` subcommand shares: exit codes, error reports, --json, ledger ids,
the metadata URI, Ctrl-C and progress bars.

Exit codes (the same for every command; docs/OPERATIONS.md)::

    0    done
    1    the operation failed (bookies unreachable, not enough bookies, timeout, I/O)
    2    bad usage or input: an unknown option, a bad ledger id, a configuration error
    3    not found: no such ledger, entry or stream
    4    refused: wrong password, fenced, closed by another writer, already exists,
         a concurrent metadata change
    5    the metadata store cannot be reached or is corrupt
    130  interrupted by Ctrl-C (SIGINT); what was under way was finished or undone first

A server (`bookie serve`, `cluster up`) stopped with Ctrl-C or SIGTERM exits 0: that is
how it is meant to stop.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import signal
import sys

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn
from rich.progress import Progress as RichProgress
from rich.progress import TextColumn, TimeRemainingColumn
from rich.table import Table

from embedlog import errors as E
from embedlog._native.format import LedgerId
from embedlog.client import Client
from embedlog.errors import IllegalOpError
from embedlog.meta.views import data_dict

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_METADATA = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
METADATA_ENV = "EMBEDLOG_METADATA"
LOG_LEVEL_ENV = "EMBEDLOG_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_JSON = "embedlog.json"          # ctx.meta key: the command was given --json

log = logging.getLogger("embedlog.cli")


def exit_code_for(exc: BaseException) -> int:
    """The exit code of an embedlog error (the table above)."""
    if isinstance(exc, (E.NoSuchLedgerError, E.NoSuchEntryError, E.GroupIdNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, (E.GroupNotEmptyError, E.CommitFailedError)):
        return EXIT_REFUSED
    if isinstance(exc, (E.UnauthorizedAccessError, E.LedgerFencedError, E.LedgerClosedError,
                        E.LedgerExistsError, E.BadVersionError, E.InvalidTermError,
                        E.ReadOnlyBookieError)):
        return EXIT_REFUSED
    if isinstance(exc, (E.ConfigError, E.IllegalOpError, E.DirectoryLockedError,
                        E.InvalidCookieError)):
        return EXIT_USAGE
    if isinstance(exc, E.MetadataError):
        return EXIT_METADATA
    return EXIT_FAILED


def _json_wanted() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_JSON))


def fail(message: str, code: int, as_json: bool | None = None, exc: BaseException | None = None):
    """Report an error on stderr (a JSON object with --json) and exit with ``code``."""
    if as_json is None:
        as_json = _json_wanted()
    if as_json:
        body = {"error": message, "exit_code": code}
        if exc is not None:
            body["type"] = type(exc).__name__
            body["code"] = getattr(exc, "code", None)
        click.echo(json.dumps(body), err=True)
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _quiet_stdout() -> None:
    # the reader of stdout went away (`| head`): what is still buffered must not fail again
    # at exit ("Exception ignored ... BrokenPipeError")
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class EmbedlogGroup(click.Group):
    """The `embedlog` group: the one error path of every command. Whatever a command raises
    becomes one line on stderr (a JSON object with --json) and the exit code of the table
    above; a traceback only with --log-level debug."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except click.UsageError as exc:
            if ctx.meta.get(_JSON):
                fail(exc.format_message(), exc.exit_code, True, exc)
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code, ctx.meta.get(_JSON), exc)
        except E.EmbedlogError as exc:
            log.debug("%s failed", ctx.invoked_subcommand, exc_info=True)
            fail(str(exc), exit_code_for(exc), ctx.meta.get(_JSON), exc)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED, ctx.meta.get(_JSON))
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(EXIT_OK)
        except OSError as exc:
            log.debug("%s failed", ctx.invoked_subcommand, exc_info=True)
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", EXIT_FAILED, ctx.meta.get(_JSON), exc)
        except Exception as exc:            # a bug: say so in one line, keep the trace for debug
            log.debug("%s failed", ctx.invoked_subcommand, exc_info=True)
            fail(f"internal error: {type(exc).__name__}: {exc} (--log-level debug shows where)",
                 EXIT_FAILED, ctx.meta.get(_JSON), exc)


# -- logging ------------------------------------------------------------------------------

_handler: logging.Handler | None = None


def configure_logging(level: str | None) -> None:
    """Log to stderr with the standard logging module: embedlog's loggers at ``level``
    (default warning; EMBEDLOG_LOG_LEVEL), other libraries' at warning unless debug."""
    global _handler
    name = (level or "warning").upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        raise click.BadParameter(f"{level!r} is not a log level ({', '.join(LOG_LEVELS)})",
                                 param_hint="--log-level")
    root = logging.getLogger()
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(_handler)
    root.setLevel(min(numeric, logging.WARNING) if numeric <= logging.DEBUG else logging.WARNING)
    logging.getLogger("embedlog").setLevel(numeric)
    # kazoo logs each failed connection attempt: embedlog's own error says it once
    logging.getLogger("kazoo").setLevel(numeric if numeric <= logging.DEBUG else logging.CRITICAL)


def _log_level_callback(ctx, param, value):
    # every command and group has the option: one not given (None) keeps what an outer one set
    if value is not None or _handler is None:
        configure_logging(value)
    return value


def log_level_option(f):
    return click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
                        envvar=LOG_LEVEL_ENV, show_envvar=True, expose_value=False,
                        is_eager=True, callback=_log_level_callback,
                        help="Log to stderr from this level up (default: warning).")(f)


def install_common_options(group: click.Group) -> None:
    """--log-level on every command and group under ``group`` (and --json's error format)."""
    for cmd in group.commands.values():
        if not any(p.name == "log_level" for p in cmd.params):
            log_level_option(cmd)
        if isinstance(cmd, click.Group):
            install_common_options(cmd)


def _json_callback(ctx, param, value):
    if value:
        ctx.meta[_JSON] = True
    return value


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, callback=_json_callback,
                        help="Print JSON for scripts (errors too, on stderr).")(f)


def console():
    """A rich Console on stdout: a terminal's width, or no wrapping at all when piped (so a
    line a script greps for is never broken)."""
    return Console(width=None if sys.stdout.isatty() else 1 << 12, highlight=False)


def make_table(header: list, rows: list, right: tuple = ()):
    """A rich table (no borders but under the header); columns named in ``right`` are
    right-aligned (numbers)."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for h in header:
        t.add_column(h, justify="right" if h in right else "left", no_wrap=True)
    for r in rows:
        t.add_row(*("-" if c is None else str(c) for c in r))
    return t


def table(header: list, rows: list, footer: str | None = None, right: tuple = ()) -> None:
    """Print rows under a header as a rich table, then ``footer``."""
    out = console()
    if rows:
        out.print(make_table(header, rows, right))
    if footer:
        click.echo(footer)


def emit(as_json: bool, data, text: str | None = None) -> None:
    """Print ``data`` as one JSON document, or ``text`` for a person."""
    if as_json:
        click.echo(json.dumps(data, default=str))
    elif text is not None:
        click.echo(text)


# -- the metadata service ------------------------------------------------------------------

def metadata_option(f):
    return click.option(
        "--metadata", "metadata_uri", envvar=METADATA_ENV, show_envvar=True, default=None,
        metavar="URI", help="Metadata service URI of the cluster, e.g. sqlite:///abs/meta.db "
        "or zk+hierarchical://127.0.0.1:2181/ledgers.")(f)


def require_metadata(metadata_uri: str | None) -> str:
    if not metadata_uri:
        raise click.UsageError(f"no metadata service: pass --metadata URI or set {METADATA_ENV}")
    return metadata_uri


def open_client(metadata_uri: str | None):
    require_metadata(metadata_uri)
    # a URI that names no store is an error (exit 5), never a new, empty store
    return Client(metadata_uri, create_metadata=False)


# -- ledger ids (BP-35: a ledger id with --ledger-scope-id, or --ledger-qualified-name) -------

U64_MAX = (1 << 64) - 1


def ledger_id_options(f):
    """LEDGER_ID (optional argument), --ledger-scope-id and --ledger-qualified-name."""
    f = click.option("--ledger-qualified-name", "qualified_name", default=None, metavar="HEX32",
                     help="The 128-bit ledger id as 32 hex digits (instead of LEDGER_ID).")(f)
    f = click.option("--ledger-scope-id", "scope_id", type=click.IntRange(0, U64_MAX), default=None,
                     help="Scope id of LEDGER_ID (the high 64 bits of the 128-bit id); default 0.")(f)
    f = click.argument("ledger_id", required=False, type=click.IntRange(0, U64_MAX))(f)
    return f


def resolve_ledger_id(ledger_id, scope_id, qualified_name):
    """The LedgerId the three ledger options name; a UsageError (exit 2) when they disagree."""
    if qualified_name is not None:
        if ledger_id is not None:
            raise click.UsageError("give LEDGER_ID or --ledger-qualified-name, not both")
        try:
            lid = LedgerId.parse(qualified_name)
        except IllegalOpError as exc:
            raise click.BadParameter(str(exc), param_hint="--ledger-qualified-name") from None
        if scope_id is not None and scope_id != lid.scope_id:
            raise click.UsageError(f"--ledger-scope-id {scope_id} disagrees with the qualified "
                                   f"name's scope id {lid.scope_id}")
        return lid
    if ledger_id is None:
        raise click.UsageError("name a ledger: LEDGER_ID [--ledger-scope-id S] or "
                               "--ledger-qualified-name HEX32")
    try:
        return LedgerId(scope_id or 0, ledger_id)
    except IllegalOpError as exc:
        raise click.BadParameter(str(exc), param_hint="LEDGER_ID") from None


def ledger_label(store, ref) -> str:
    """How a command's text names a ledger (``ref``: a LedgerId or a views.ledger_ref dict):
    on a root in BookKeeper's format, BookKeeper's plain decimal id (its ledgers are all in
    scope 0, and its operators and tools know them by that id); elsewhere the qualified name."""
    if isinstance(ref, dict):
        scope, lid, qname = ref["ledger_scope_id"], ref["ledger_id"], ref["ledger_qualified_name"]
    else:
        scope, lid, qname = ref.scope_id, ref.ledger_id, ref.qualified_name
    if scope == 0 and getattr(store, "metadata_format", None) == "bookkeeper":
        return str(lid)
    return qname


# -- Ctrl-C -----------------------------------------------------------------------------------

class StopOnInterrupt:
    """The first Ctrl-C asks the command to stop after the step under way (so nothing is left
    half-done: a ledger is closed at its last acknowledged entry); a second one aborts."""

    def __init__(self, what: str = "finishing the step under way"):
        self.what = what
        self.requested = False
        self._old = None

    def __call__(self) -> bool:
        return self.requested

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        click.echo(f"\ninterrupted: {self.what} (Ctrl-C again to abort)", err=True)

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)


# -- progress -------------------------------------------------------------------------------------

def progress_option(f):
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="Show a progress bar on stderr (default: when stderr is a terminal).")(f)


class Progress:
    """A rich progress bar on stderr, or nothing."""

    def __init__(self, enabled: bool | None, label: str, total: int | None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        if enabled:
            self._bar = RichProgress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), console=Console(stderr=True))
            self._task = self._bar.add_task(label, total=total)

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def update(self, completed: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


def format_data(data: bytes, fmt: str) -> str:
    if fmt == "hex":
        return data.hex()
    if fmt == "base64":
        return base64.b64encode(data).decode()
    return data.decode("utf-8", "backslashreplace")


def format_option(f):
    return click.option("--format", "fmt", type=click.Choice(["text", "hex", "base64"]),
                        default="text", show_default=True,
                        help="How entry data is printed (ignored with --json).")(f)


def print_entry(key: str, number: int, data: bytes, fmt: str, as_json: bool) -> None:
    """One entry: "NUMBER<TAB>DATA", or a JSON line naming the number ``key``."""
    if as_json:
        click.echo(json.dumps({key: number, **data_dict(data)}))
    else:
        click.echo(f"{number}\t{format_data(data, fmt)}")


def follow(entries, stop, count, show) -> None:
    """Show what a tail yields as it comes; return after ``count`` entries, exit 130 when
    Ctrl-C (``stop``) ended it."""
    printed = 0
    for e in entries:
        show(e)
        sys.stdout.flush()
        printed += 1
        if count is not None and printed >= count:
            return
    if stop():
        sys.exit(EXIT_INTERRUPTED)


def confirm_delete(what: str, yes: bool, as_json: bool) -> None:
    """Ask before deleting ``what`` unless --yes; without a terminal, --yes is required."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail("deleting needs --yes when there is no terminal to ask", 2, as_json)
    click.confirm(f"delete {what}?", abort=True)

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

import functools
import json
import signal
import sys

import click

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_METADATA = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
METADATA_ENV = "EMBEDLOG_METADATA"


def exit_code_for(exc: BaseException) -> int:
    from embedlog import errors as E
    if isinstance(exc, (E.NoSuchLedgerError, E.NoSuchEntryError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, (E.UnauthorizedAccessError, E.LedgerFencedError, E.LedgerClosedError,
                        E.LedgerExistsError, E.BadVersionError, E.InvalidTermError,
                        E.ReadOnlyBookieError)):
        return EXIT_REFUSED
    if isinstance(exc, (E.ConfigError, E.IllegalOpError)):
        return EXIT_USAGE
    if isinstance(exc, E.MetadataError):
        return EXIT_METADATA
    return EXIT_FAILED


def fail(message: str, code: int, as_json: bool = False, exc: BaseException | None = None):
    """Report an error on stderr (a JSON object with --json) and exit with ``code``."""
    if as_json:
        body = {"error": message, "exit_code": code}
        if exc is not None:
            body["type"] = type(exc).__name__
            body["code"] = getattr(exc, "code", None)
        click.echo(json.dumps(body), err=True)
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(f):
    """Turn embedlog errors, Ctrl-C and a closed stdout pipe into an exit code and one line."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from embedlog.errors import EmbedlogError
        as_json = bool(kwargs.get("as_json"))
        try:
            return f(*args, **kwargs)
        except EmbedlogError as exc:
            fail(str(exc), exit_code_for(exc), as_json, exc)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED, as_json)
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly, as a filter should
            import os
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            sys.exit(EXIT_OK)
    return wrapper


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(f)


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


def open_client(metadata_uri: str | None):
    if not metadata_uri:
        raise click.UsageError(f"no metadata service: pass --metadata URI or set {METADATA_ENV}")
    from embedlog.client import Client
    return Client(metadata_uri)


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
    from embedlog._native.format import LedgerId
    from embedlog.errors import IllegalOpError
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
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeRemainingColumn)
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
        import base64
        return base64.b64encode(data).decode()
    return data.decode("utf-8", "backslashreplace")


def data_dict(data: bytes) -> dict:
    import base64
    out = {"size": len(data), "data_base64": base64.b64encode(data).decode()}
    try:
        out["data"] = data.decode("utf-8")
    except UnicodeDecodeError:
        out["data"] = None
    return out


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

"""The effective configuration of a bookie process, and where each value came from.

Sources, lowest precedence first::

    default        BookieConfig's declared default (embedlog/config.py)
    file PATH      a TOML file: --conf PATH, or the file named by EMBEDLOG_CONF
    env NAME       EMBEDLOG_<KEY IN CAPITALS>, e.g. EMBEDLOG_JOURNAL_MAX_GROUP_WAIT_MS=1
                   (metadata_service_uri reads EMBEDLOG_METADATA, as the client commands do)
    option ...     a command-line option: --set KEY=VALUE, --listen, --metadata, --http-port, ...

The TOML file holds keys at the top level, with BookKeeper's names in snake_case::

    journal_max_group_wait_ms = 1.0
    metadata_service_uri = "zk+hierarchical://10.0.0.1:2181/ledgers"
    http_server_enabled = true
    http_server_port = 8080

Every value is checked against the key's type and range before the bookie starts; an
error names the key and the source that set it. Unknown keys are errors (a misspelt key
must not be silently ignored); unknown EMBEDLOG_* variables are reported by
`embedlog config show`, not refused, since other tools share the prefix.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from embedlog.bookie.gc import check_config
from embedlog.config import BookieConfig
from embedlog.errors import ConfigError

ENV_PREFIX = "EMBEDLOG_"
CONF_ENV = "EMBEDLOG_CONF"
ENV_ALIASES = {"metadata_service_uri": "EMBEDLOG_METADATA"}
# EMBEDLOG_* variables that are not configuration keys (build switches, tests, tools, and
# the process-wide settings of docs/CONFIGURATION.md)
OTHER_ENV = {"EMBEDLOG_CONF", "EMBEDLOG_DEBUG", "EMBEDLOG_ANNOTATE", "EMBEDLOG_FAILPOINTS",
             "EMBEDLOG_LEDGER_PASSWORD", "EMBEDLOG_ARTIFACTS", "EMBEDLOG_LOG_LEVEL",
             "EMBEDLOG_EVENT_LOOP", "EMBEDLOG_ARENA_CACHE_MB"}
MAX_CONF_BYTES = 1 << 20


def env_name(key: str) -> str:
    return ENV_ALIASES.get(key, ENV_PREFIX + key.upper())


def parse_text(key: str, text: str, source: str):
    """A string (environment, --set) as the key's type."""
    f = BookieConfig.keys()[key]
    kind = type(f.default)
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} (from {source}) must be true or false, got {text!r}")
    if kind is int:
        try:
            return int(text.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(f"{key} (from {source}) must be an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{key} (from {source}) must be a number, got {text!r}") from None
    return text


def check(key: str, value, source: str):
    """The value checked (type, range) as BookieConfig checks it; the error names the source."""
    keys = BookieConfig.keys()
    if key not in keys:
        raise ConfigError(f"unknown configuration key {key!r} (from {source})")
    try:
        cfg = BookieConfig.from_dict({key: value})
    except ConfigError as exc:
        raise ConfigError(f"{exc} (from {source})") from None
    return getattr(cfg, key)


def load_toml(path: str) -> dict:
    # optional dependency: tomllib is stdlib from 3.11, tomli before
    try:
        import tomllib
    except ModuleNotFoundError:            # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONF_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    if len(data) > MAX_CONF_BYTES:
        raise ConfigError(f"configuration file {path} is larger than {MAX_CONF_BYTES} bytes")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError and UnicodeDecodeError are ValueErrors, as is an integer of more
        # digits than int() takes; deep nesting exhausts tomllib's recursion
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    for key, value in doc.items():
        if isinstance(value, dict):
            raise ConfigError(f"[{key}] in {path}: put keys at the top level (no tables)")
    return doc


@dataclass
class Effective:
    """Values of every key, and for each the source that set it."""
    values: dict
    sources: dict
    conf_path: str | None = None
    unknown_env: list = field(default_factory=list)

    def bookie_config(self) -> BookieConfig:
        return BookieConfig.from_dict(self.values)

    def rows(self) -> list:
        return [{"key": k, "value": self.values[k], "source": self.sources[k]} for k in self.values]


def resolve(conf_path: str | None = None, environ=None, options: dict | None = None) -> Effective:
    """Merge defaults, the TOML file, the environment and ``options`` (key -> (value, label));
    check every value. ConfigError names the key and where it came from."""
    environ = os.environ if environ is None else environ
    cfg = BookieConfig()
    values = cfg.as_dict()
    sources = {k: "default" for k in values}
    if conf_path is None and environ.get(CONF_ENV):
        conf_path = environ[CONF_ENV]
    if conf_path is not None:
        conf_path = os.path.abspath(conf_path)
        for key, value in load_toml(conf_path).items():
            label = f"file {conf_path}"
            values[key] = check(key, value, label)
            sources[key] = label
    for key in values:
        name = env_name(key)
        if name in environ:
            label = f"env {name}"
            values[key] = check(key, parse_text(key, environ[name], label), label)
            sources[key] = label
    for key, (value, label) in (options or {}).items():
        values[key] = check(key, value, label)
        sources[key] = label
    # the whole, once more, with the checks across keys the bookie makes when it starts
    # (thresholds that must be ordered): what config show accepts, bookie serve accepts
    check_config(BookieConfig.from_dict(values))
    known = {env_name(k) for k in values} | OTHER_ENV
    unknown = sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known
                     and not n.startswith("EMBEDLOG_CHAOS_") and not n.startswith("EMBEDLOG_CRASH_"))
    return Effective(values, sources, conf_path, unknown)


def set_pairs(pairs) -> dict:
    """--set KEY=VALUE pairs as options for resolve()."""
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set wants KEY=VALUE, got {pair!r}")
        if key not in BookieConfig.keys():
            raise ConfigError(f"unknown configuration key {key!r} (from option --set)")
        out[key] = (parse_text(key, text, "option --set"), "option --set")
    return out


def serve_options(*, settings=(), listen=None, advertised_address=None, metadata_uri=None,
                  http_port=None, autorecovery=None) -> dict:
    """The options of `bookie serve` (and `config show`) as keys for resolve()."""
    out = set_pairs(settings)
    if listen is not None:
        # start-up cost: serve loads the bookie and the admin server; the fuzzers import this module
        from embedlog.cli.serve import parse_listen
        host, port = parse_listen(listen)
        out["listening_interface"] = (host, "option --listen")
        out["bookie_port"] = (port, "option --listen")
    if advertised_address is not None:
        out["advertised_address"] = (advertised_address, "option --advertised-address")
    if metadata_uri is not None:
        out["metadata_service_uri"] = (metadata_uri, "option --metadata")
    if http_port is not None:
        out["http_server_enabled"] = (True, "option --http-port")
        out["http_server_port"] = (http_port, "option --http-port")
    if autorecovery is not None:
        out["auto_recovery_daemon_enabled"] = (autorecovery, "option --autorecovery")
    return out


def markdown_table() -> str:
    """docs/CONFIGURATION.md's table of keys, from the declarations."""
    lines = ["| key | default | range | env | meaning |", "| --- | --- | --- | --- | --- |"]
    for name, f in BookieConfig.keys().items():
        lo, hi = f.metadata["min"], f.metadata["max"]
        rng = f"{lo}..{hi}" if lo is not None or hi is not None else "-"
        default = f.default if f.default != "" else '""'
        lines.append(f"| `{name}` | {default} | {rng} | `{env_name(name)}` | {f.metadata['doc']} |")
    return "\n".join(lines)

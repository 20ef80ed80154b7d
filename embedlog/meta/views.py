"""Ledger ids and ledger metadata as JSON-ready dicts: the one shape the admin HTTP API
and the `embedlog` command both print (one spelling of each field, BP-35's names for the
128-bit id)."""
from __future__ import annotations

import base64

STREAM_NAME_KEY = "stream.name"


def ledger_ref(lid) -> dict:
    return {"ledger_qualified_name": lid.qualified_name, "ledger_scope_id": lid.scope_id,
            "ledger_id": lid.ledger_id}


def _custom_value(v: bytes):
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": v.hex()}


def metadata_dict(md) -> dict:
    """Ledger metadata for people and scripts; the password itself is never shown."""
    out = ledger_ref(md.ledger_id)
    out.update({
        "state": md.state.name,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "digest_type": md.digest_type.name,
        "has_password": bool(md.password),
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "ctime_ms": md.ctime_ms,
        "term": md.term,
        "unbounded": md.unbounded,
        "fragments": [{"first_entry_id": first, "ensemble": list(bookies)}
                      for first, bookies in md.fragments],
        "custom_metadata": {k: _custom_value(v) for k, v in md.custom_metadata.items()},
    })
    first = getattr(md, "first_entry_id", None)
    if first is not None:
        out["first_entry_id"] = first
    name = md.custom_metadata.get(STREAM_NAME_KEY)
    if md.unbounded and name is not None:
        out["stream_name"] = _custom_value(name)
    return out


def data_dict(data: bytes) -> dict:
    """An entry's bytes for JSON: ``data`` as UTF-8 text (None when it is not) and always
    ``data_base64``."""
    out = {"size": len(data), "data_base64": base64.b64encode(data).decode()}
    try:
        out["data"] = data.decode("utf-8")
    except UnicodeDecodeError:
        out["data"] = None
    return out

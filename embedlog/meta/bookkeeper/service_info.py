"""BookKeeper's bookie registration body (BookieServiceInfoFormat), to and from the
``info`` of a BookieRegistration.

A bookie registers as an ephemeral ``ROOT/available/<bookie id>`` (``available/readonly/``
when read-only) whose data is, in protobuf binary (DataFormats.proto)::

    BookieServiceInfoFormat
      6 endpoints   repeated Endpoint { 1 id string, 2 port int32, 3 host string,
                                        4 protocol string, 5 auth repeated string,
                                        6 extensions repeated string }
      7 properties  map<string, string>: repeated { 1 key, 2 value }

Java bookies publish one endpoint, ``id "bookie", protocol "bookie-rpc"``; an empty body
(bookies before 4.12) means that endpoint at the bookie id. A client connects to the
bookie-rpc endpoint. embedlog's bookies publish a bookie-rpc endpoint too, and beside it
an ``id "embedlog", protocol "embedlog"`` endpoint and their ``info`` as the JSON property
``embedlog.info``; so ``decode`` gives every registration ``info["protocol"]``
("embedlog" when that endpoint is there, else "bookkeeper") and ``info["address"]``
(HOST:PORT of the endpoint of that protocol, else the bookie id), with ``endpoints``
and ``properties`` as published.
"""

from __future__ import annotations

import json

from embedlog.errors import MetadataError
from embedlog.meta.bookkeeper import protobuf as pb

ENDPOINTS, PROPERTIES = 6, 7
EP_ID, EP_PORT, EP_HOST, EP_PROTOCOL, EP_AUTH, EP_EXTENSIONS = 1, 2, 3, 4, 5, 6
BOOKIE_RPC = "bookie-rpc"
EMBEDLOG = "embedlog"
INFO_PROPERTY = "embedlog.info"


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MetadataError(f"not a HOST:PORT address: {address!r}")
    return host, int(port)


def encode(endpoints: list[dict], properties: dict[str, str]) -> bytes:
    """BookieServiceInfoFormat of endpoints ({id, host, port, protocol, auth?, extensions?})."""
    w = pb.Writer()
    for ep in endpoints:
        e = pb.Writer().string(EP_ID, ep["id"]).varint(EP_PORT, int(ep["port"]))
        e.string(EP_HOST, ep["host"]).string(EP_PROTOCOL, ep["protocol"])
        for a in ep.get("auth", ()):
            e.string(EP_AUTH, a)
        for x in ep.get("extensions", ()):
            e.string(EP_EXTENSIONS, x)
        w.data(ENDPOINTS, e.getvalue())
    for key, value in properties.items():
        w.data(PROPERTIES, pb.Writer().string(1, key).string(2, value).getvalue())
    return w.getvalue()


def decode(data: bytes) -> tuple[list[dict], dict[str, str]]:
    """(endpoints, properties) of a BookieServiceInfoFormat; MetadataError when malformed."""
    endpoints, properties = [], {}
    for f in pb.parse(data):
        if f.number == ENDPOINTS and f.wire_type == pb.LEN:
            ep: dict = {"id": "", "host": "", "port": 0, "protocol": "", "auth": [], "extensions": []}
            for g in pb.parse(f.data):
                if g.number == EP_PORT and g.wire_type == pb.VARINT:
                    ep["port"] = pb.signed32(g.value)
                elif g.wire_type == pb.LEN and g.number in (EP_ID, EP_HOST, EP_PROTOCOL):
                    ep[{EP_ID: "id", EP_HOST: "host", EP_PROTOCOL: "protocol"}[g.number]] = \
                        pb.text(g.data, "an endpoint field")
                elif g.wire_type == pb.LEN and g.number in (EP_AUTH, EP_EXTENSIONS):
                    ep["auth" if g.number == EP_AUTH else "extensions"].append(
                        pb.text(g.data, "an endpoint field"))
            endpoints.append(ep)
        elif f.number == PROPERTIES and f.wire_type == pb.LEN:
            entry = {g.number: pb.text(g.data, "a property") for g in pb.parse(f.data)
                     if g.wire_type == pb.LEN and g.number in (1, 2)}
            properties[entry.get(1, "")] = entry.get(2, "")
    return endpoints, properties


def legacy_endpoint(bookie_id: str) -> dict:
    """The endpoint BookKeeper assumes for a registration without a body."""
    host, port = _host_port(bookie_id)
    return {"id": bookie_id, "host": host, "port": port, "protocol": BOOKIE_RPC,
            "auth": [], "extensions": []}


def registration_info(bookie_id: str, data: bytes | None) -> dict:
    """The ``info`` of a registration in BookKeeper's format (see the module docstring).

    A body that does not parse still names a live bookie: its info then holds only the
    address (the bookie id) and protocol "bookkeeper", as BookKeeper would assume."""
    try:
        if data:
            endpoints, properties = decode(data)
        else:
            endpoints, properties = [legacy_endpoint(bookie_id)], {}
    except MetadataError:
        endpoints, properties = [], {}
    info: dict = {}
    if INFO_PROPERTY in properties:
        try:
            extra = json.loads(properties[INFO_PROPERTY])
            if isinstance(extra, dict):
                info.update(extra)
        except (ValueError, RecursionError):
            pass
    by_protocol = {ep["protocol"]: ep for ep in reversed(endpoints)}
    protocol = EMBEDLOG if EMBEDLOG in by_protocol else "bookkeeper"
    ep = by_protocol.get(EMBEDLOG if protocol == EMBEDLOG else BOOKIE_RPC)
    info.update(protocol=protocol,
                address=f"{ep['host']}:{ep['port']}" if ep and ep["host"] else bookie_id,
                endpoints=endpoints, properties=properties)
    return info


def registration_body(bookie_id: str, info: dict | None) -> bytes:
    """What an embedlog bookie registers: a bookie-rpc endpoint (``info["bookie_rpc"]``, else
    the bookie id), an embedlog endpoint (``info["address"]``, else the bookie id), and
    ``info`` (without those keys) as the JSON property ``embedlog.info``."""
    info = dict(info or {})
    rpc = _host_port(info.pop("bookie_rpc", bookie_id))
    own = _host_port(info.get("address", bookie_id))
    for derived in ("protocol", "endpoints", "properties"):
        info.pop(derived, None)          # a decoded info handed back: these are recomputed
    endpoints = [
        {"id": "bookie", "host": rpc[0], "port": rpc[1], "protocol": BOOKIE_RPC},
        {"id": EMBEDLOG, "host": own[0], "port": own[1], "protocol": EMBEDLOG},
    ]
    return encode(endpoints, {INFO_PROPERTY: json.dumps(info, sort_keys=True, separators=(",", ":"))})

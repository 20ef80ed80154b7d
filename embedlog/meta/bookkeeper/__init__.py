"""Apache BookKeeper's metadata formats, so embedlog shares a ZooKeeper root with BookKeeper.

One concept per module:

- ``protobuf``: protobuf's binary wire format, keeping unknown fields byte for byte;
- ``textformat``: protobuf's text format (cookies, version-2 ledger metadata);
- ``ledger_metadata``: the ledger record (``BookieMetadataFormatVersion`` 3, and 2) to and
  from embedlog's LedgerMetadata, refusing what BookKeeper cannot carry;
- ``layout``: the LAYOUT record and the ledger paths of the hierarchical layouts;
- ``service_info``: bookie registrations (BookieServiceInfo);
- ``cookie``: bookie cookies.

``embedlog.meta.zookeeper.ZkMetadataStore`` uses them on a root in BookKeeper's format
(docs/METADATA.md, "BookKeeper's format"). Nothing here talks to a server.
"""

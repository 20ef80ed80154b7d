# The sizes the wire codecs share, written once: Cython modules cimport them as C constants
# (`from embedlog._native.wire_sizes cimport MASTER_KEY_BYTES`), Python imports the same
# names from the module (`from embedlog._native.wire_sizes import MASTER_KEY_BYTES`).
cpdef enum:
    MASTER_KEY_BYTES = 20           # a ledger's master key on every wire (BookKeeper's SHA-1 of the password)
    MAX_FRAME_BYTES = 5242880       # 5 MiB: BookKeeper's nettyMaxFrameSizeBytes, the largest v2/v3 frame
    FRAME_HEADERS_BYTES = 4096      # what embedlog's frame limit allows past MAX_FRAME_BYTES for its headers
    REQ_HEAD_BYTES = 56             # embedlog's request header (protocol.REQ_HEAD: >BBHQQQ20sQ)

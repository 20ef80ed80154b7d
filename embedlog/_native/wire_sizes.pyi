"""The sizes the wire codecs share (pyx/embedlog/_native/wire_sizes.pxd)."""
MASTER_KEY_BYTES: int
MAX_FRAME_BYTES: int
FRAME_HEADERS_BYTES: int
REQ_HEAD_BYTES: int

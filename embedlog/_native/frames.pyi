# Type stubs of the Cython module embedlog._native.frames (pyx/embedlog/_native/frames.pyx):
# embedlog's ADD frame built and cut, and the server's frame buffers.
_Buffer = bytes | bytearray | memoryview

def add_request(request_id: int, scope: int, ledger: int, master_key: _Buffer,
                entries: list[bytes] | list[_Buffer], flags: int = ..., term: int = ...) -> bytes: ...
def split_add_body(body: _Buffer) -> list[memoryview]: ...
def frame_buffer(n: int) -> bytearray:
    """A bytearray of n bytes, not zero-filled: every byte is written before it is read.
    Frames of 64 KiB to 8 MiB may be a bytearray handed out before that nobody holds now."""

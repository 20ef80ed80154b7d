# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""embedlog's ADD frame in C, both ways: built (``add_request``, the client's, through
net/protocol.py) and its body cut into entries (``split_add_body``, the bookie's); and the
bytearrays the server reads frames into (``frame_buffer``, FrameReader's). The wire's
layer, net (tests/test_layers.py).

Bounds: an ADD frame is sized once from the entries' lengths (each checked to fit a u32 and
the total to fit the frame's u32 length) and every copy is bounded by that size. An ADD
body is cut only where its sizes say, each checked against the body's end (64-bit sums).
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.list cimport PyList_Append, PyList_GET_ITEM
from cpython.ref cimport Py_REFCNT
from cpython.bytearray cimport PyByteArray_FromStringAndSize, PyByteArray_Resize

from embedlog._native.format cimport el_get32, el_put32, el_put64
from embedlog._native.wire_sizes cimport REQ_HEAD_BYTES as REQ_HEAD_SIZE  # protocol.REQ_HEAD
from embedlog._native.wire_sizes cimport MASTER_KEY_BYTES as KEY_SIZE

from embedlog.errors import CorruptedDataError, IllegalOpError

cdef enum:
    PROTOCOL_VERSION = 1        # protocol.VERSION
    OP_ADD = 1                  # protocol.ADD


cdef bytes _add_frame(uint64_t request_id, uint64_t scope, uint64_t ledger, master_key,
                      int flags, uint64_t term, Py_ssize_t count, Py_ssize_t body):
    """An ADD frame with its head written and room for ``body`` bytes of sized entries
    after the count (checked: the key's size, the flags, the count and the frame's u32)."""
    cdef const uint8_t[::1] key = master_key
    cdef Py_ssize_t total = REQ_HEAD_SIZE + 4 + body
    if key.shape[0] != KEY_SIZE:
        raise IllegalOpError(f"master key of {key.shape[0]} bytes, expected {KEY_SIZE}")
    if not 0 <= flags <= 0xFFFF:
        raise IllegalOpError(f"flags {flags} do not fit 16 bits")
    if count > 0xFFFFFFFF:
        raise IllegalOpError(f"{count} entries do not fit one frame")
    if body < 0 or total > 0xFFFFFFFF:
        raise IllegalOpError(f"an ADD frame of {total} bytes does not fit its length")
    out = PyBytes_FromStringAndSize(NULL, total + 4)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    el_put32(p, <uint32_t>total)
    p[4] = PROTOCOL_VERSION
    p[5] = OP_ADD
    p[6] = <uint8_t>(flags >> 8)
    p[7] = <uint8_t>flags
    el_put64(p + 8, request_id)
    el_put64(p + 16, scope)
    el_put64(p + 24, ledger)
    memcpy(p + 32, &key[0], KEY_SIZE)
    el_put64(p + 52, term)
    el_put32(p + 60, <uint32_t>count)
    return out


def add_request(uint64_t request_id, uint64_t scope, uint64_t ledger, master_key, entries,
                int flags=0, uint64_t term=0):
    """An ADD frame: the length, protocol.REQ_HEAD, the entry count, then each entry with
    its u32 size (the same bytes as the struct-built frame, in one allocation)."""
    cdef const uint8_t[::1] view
    cdef Py_ssize_t body = 0, n, pos
    cdef Py_ssize_t count = len(entries)
    for e in entries:
        n = len(e)
        body += 4 + n
        if n > 0xFFFFFFFF or body > 0xFFFFFFFF:
            raise IllegalOpError(f"an ADD frame of over {body} bytes does not fit its length")
    out = _add_frame(request_id, scope, ledger, master_key, flags, term, count, body)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(out)
    pos = 4 + REQ_HEAD_SIZE + 4
    for e in entries:
        if PyBytes_CheckExact(e):
            n = PyBytes_GET_SIZE(e)
            if pos + 4 + n > end:
                raise IllegalOpError("an entry changed size while its frame was built")
            el_put32(p + pos, <uint32_t>n)
            memcpy(p + pos + 4, PyBytes_AS_STRING(e), n)
        else:
            view = e
            n = view.shape[0]
            if pos + 4 + n > end:
                raise IllegalOpError("an entry changed size while its frame was built")
            el_put32(p + pos, <uint32_t>n)
            if n:
                memcpy(p + pos + 4, &view[0], n)
        pos += 4 + n
    if pos != end:
        raise IllegalOpError("an entry changed size while its frame was built")
    return out


def sized_entries(const uint8_t[::1] part):
    """How many entries ``part`` holds as an ADD body holds them (each a u32 size, then
    that many bytes, back to back, ending exactly at its end); IllegalOpError otherwise."""
    cdef Py_ssize_t pos = 0, n = part.shape[0], count = 0
    while pos < n:
        if pos + 4 > n:
            raise IllegalOpError("sized entries cut in an entry's size")
        pos += 4 + <Py_ssize_t>el_get32(&part[pos])
        if pos > n:
            raise IllegalOpError("sized entries cut in an entry")
        count += 1
    return count


def add_request_sized(uint64_t request_id, uint64_t scope, uint64_t ledger, master_key,
                      list parts, int flags=0, uint64_t term=0):
    """add_request of entries already sized as the frame carries them: ``parts`` are
    bytes, each one or more entries (u32 size, then the entry), copied whole. Each part
    is walked first (sized_entries), so the count and every copy are bounded by what the
    parts hold."""
    cdef Py_ssize_t count = 0, body = 0, pos, n
    for part in parts:
        if not PyBytes_CheckExact(part):
            raise IllegalOpError(f"sized entries are bytes, got {type(part).__name__}")
        count += sized_entries(part)
        body += PyBytes_GET_SIZE(part)
    out = _add_frame(request_id, scope, ledger, master_key, flags, term, count, body)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    pos = 4 + REQ_HEAD_SIZE + 4
    for part in parts:
        n = PyBytes_GET_SIZE(part)
        memcpy(p + pos, PyBytes_AS_STRING(part), n)
        pos += n
    return out


def split_add_body(body):
    """The entries of an ADD body (count:u32, then count times size:u32 entry[size]), as
    views of ``body``: the bookie's per-entry loop, in C. Raises what protocol's
    parse_add_body documents."""
    cdef const uint8_t[::1] b = body
    cdef Py_ssize_t size = b.shape[0], pos = 4, start
    cdef uint32_t count, i
    if size < 4:
        raise CorruptedDataError("add request without an entry count")
    count = el_get32(&b[0])
    out = []
    for i in range(count):
        start = pos + 4
        if start > size:
            raise CorruptedDataError("add request truncated in an entry size")
        pos = start + <Py_ssize_t>el_get32(&b[start - 4])
        if pos > size:
            raise CorruptedDataError("add request truncated in an entry")
        PyList_Append(out, body[start:pos])    # a view: the kernels copy it once
    if pos != size:
        raise CorruptedDataError("add request has trailing bytes")
    if not out:
        raise IllegalOpError("add request without entries")
    return out


cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc
        char *ob_bytes
        char *ob_start
        Py_ssize_t ob_exports

cdef enum:
    SPARE_FRAMES = 4                  # bytearrays kept for reuse, process-wide
    SPARE_MIN = 64 * 1024             # smaller frames come from malloc's free lists anyway
    SPARE_MAX = 8 * 1024 * 1024       # BookKeeper's 5 MiB frame and headers fit

# Frames handed out before, kept to be handed out again once nobody else holds them. A
# bookie's ADD frames are 0.1-1 MiB; malloc gave each one fresh pages from the kernel (it
# trims or unmaps what a freed frame held), and zeroing those pages on first touch was 78% of
# a 1/1/1 bookie's page faults (0.17-0.19 per 1 KiB add).
cdef list _spares = []


cdef inline bint _reusable(PyByteArrayObject *b, Py_ssize_t n) noexcept:
    # only the list holds it: no frame, request, entry view or memoryview export is alive
    # (a view holds a reference to its bytearray), and under the GIL nobody but
    # frame_buffer can take a new one (the list is this module's own); and its allocation
    # takes n bytes without a realloc (PyByteArray_Resize's "minor downsize": n + 1 <= alloc
    # and n >= alloc / 2)
    return (Py_REFCNT(<object>b) == 1 and b.ob_exports == 0 and b.ob_start == b.ob_bytes
            and n + 1 <= b.ob_alloc and n >= b.ob_alloc // 2)


def frame_buffer(Py_ssize_t n):
    """A bytearray of ``n`` bytes left as malloc gave them, for a frame the socket's reads
    fill whole before anyone reads it (FrameReader): bytearray(n) zero-fills first, 17 ns
    per KiB here (2% of a replicated bookie's samples in one profile). Frames of SPARE_MIN
    to SPARE_MAX bytes reuse a bytearray handed out earlier that nobody holds any more (its
    pages already faulted in); at most SPARE_FRAMES are kept."""
    cdef Py_ssize_t i, k = len(_spares), free = -1
    cdef PyByteArrayObject *b
    cdef object out
    if n < 0:
        raise ValueError(f"a frame of {n} bytes")
    if n < SPARE_MIN or n > SPARE_MAX:
        return PyByteArray_FromStringAndSize(NULL, n)
    for i in range(k):
        b = <PyByteArrayObject *>PyList_GET_ITEM(_spares, i)
        if _reusable(b, n):
            out = <object>b
            PyByteArray_Resize(out, n)        # cannot fail: no realloc, no export
            return out
        if free < 0 and Py_REFCNT(<object>b) == 1:
            free = i                  # free, but the wrong size: it makes way if the list is full
    out = PyByteArray_FromStringAndSize(NULL, n)
    if k < SPARE_FRAMES:
        PyList_Append(_spares, out)
    elif free >= 0:
        _spares[free] = out
    return out

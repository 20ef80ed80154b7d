# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The read fast path: one C-level call per read, from memtable, entry log or journal segment
(layout 2: a location with bit 63 set is a journal record, its crc checked on the first read
while its segment is mapped, as an entry log's blocks are; each entry's ids and digest are
checked on every read).

A LedgerReader holds the bookie's memtable, entry logger and the ledger's index
and reads without the bookie lock. That is safe because each read runs under
the GIL from lookup to the bytes it returns, without releasing it between
taking a pointer and copying out, while every writer step leaves a state a
reader can use: a memtable flush sets index locations before it clears the
memtable, and a sealed log is unmapped before it is dropped (a reader then
maps it again read-only).

Bounds: a range is checked against 0..LAC before any list or buffer is sized from it (the
wire's encoded reads are bounded by a count and a byte budget instead); an
index page's locations are indexed by ``eid & 1023`` of a checked id; read_arrays refuses
more than 2 GiB of payloads (int32 offsets) before it grows its buffer.
"""

from libc.stdint cimport uint8_t, int32_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
cimport numpy as cnp

from embedlog._native.format cimport decode_payload, check_entry, DIGEST_MAC, el_put32, el_put64
from embedlog._native.memtable cimport MemTable
from embedlog._native.entrylog cimport MappedLog
from embedlog._native.entrylogger cimport EntryLogger
from embedlog._native.index cimport LedgerIndex

from embedlog._native.format import ledger_name
from embedlog.errors import CorruptedDataError, IllegalOpError, NoSuchEntryError

cnp.import_array()
cdef Py_ssize_t MAX_VALUES = (1 << 31) - 1       # int32 offsets of a BinaryArray


cdef class LedgerReader:
    """Checked reads of one ledger, up to ``lac``."""

    cdef MemTable mt
    cdef MemTable mt2
    cdef EntryLogger el
    cdef LedgerIndex idx
    cdef readonly uint64_t scope
    cdef readonly uint64_t lid
    cdef int digest
    cdef object mac_key
    cdef public int64_t lac
    cdef MappedLog last_log
    cdef object held_page             # the page this reader used last (a scan step, a load
    cdef int64_t held_page_no         # from disk), its number and locations: kept even if
    cdef const uint64_t *held_locs    # the cache evicts it (then a clean copy)
    cdef readonly Py_ssize_t reads
    cdef bint crc_fresh               # the entry _locate found just had its CRC32C checked

    def __init__(self, MemTable mt, MemTable mt2, EntryLogger el, LedgerIndex idx, uint64_t scope,
                 uint64_t lid, int digest, mac_key, int64_t lac):
        self.mt = mt
        self.mt2 = mt2
        self.el = el
        self.idx = idx
        self.scope = scope
        self.lid = lid
        self.digest = digest
        self.mac_key = mac_key
        self.lac = lac
        self.last_log = None
        self.held_page = None
        self.held_page_no = -1
        self.held_locs = NULL
        self.reads = 0

    cdef void _hold(self, object page, int64_t page_no):
        self.held_page = page
        self.held_page_no = page_no
        self.held_locs = <const uint64_t *>cnp.PyArray_DATA(page)

    cdef const uint64_t *_page_locs(self, int64_t page_no, bint fresh) except? NULL:
        """The locations of an index page, NULL if it has none; valid until the GIL is
        released or a page is loaded. The index's cached page first (an array lookup: no
        Python object is touched), then unless ``fresh`` the page this reader holds, then
        the index, which may read the page from disk."""
        cdef const uint64_t *locs = self.idx.cached_locs(page_no)
        if locs != NULL:
            return locs
        if not fresh and page_no == self.held_page_no:
            return self.held_locs
        page = self.idx._page(page_no, False)
        if page is None:
            return NULL
        self._hold(page, page_no)         # alive even if the cache evicted it at once
        return self.held_locs

    cdef const uint8_t *_locate(self, int64_t eid, Py_ssize_t *n) except NULL:
        """The encoded entry, in a memtable or an entry log (valid while the GIL is held)."""
        self.crc_fresh = False
        cdef const uint8_t *p = self.mt.get(self.scope, self.lid, eid, n)
        cdef const uint64_t *locs
        cdef uint64_t loc = 0
        if p == NULL:
            p = self.mt2.get(self.scope, self.lid, eid, n)   # the other memtable (active or flushing)
        cdef int64_t page_no = eid >> 10
        cdef MappedLog m
        cdef int attempt
        if p != NULL:
            return p
        for attempt in range(3):
            locs = self._page_locs(page_no, attempt > 0)
            loc = locs[eid & 1023] if locs != NULL else 0
            if loc == 0 and attempt == 0:
                # a held copy may be older than the entry: ask the index
                locs = self._page_locs(page_no, True)
                loc = locs[eid & 1023] if locs != NULL else 0
            if loc == 0:
                p = self.mt.get(self.scope, self.lid, eid, n)   # flushed meanwhile?
                if p == NULL:
                    p = self.mt2.get(self.scope, self.lid, eid, n)
                if p != NULL:
                    return p
                raise NoSuchEntryError(f"no entry {eid} in ledger {ledger_name(self.scope, self.lid)}")
            m = self.last_log
            if m is None or m.log_id != (loc >> 32) or m.base == NULL:
                m = self.el._log(loc >> 32)          # may map the log: the GIL is released
                self.last_log = m
            p = NULL
            if m is not None:
                p = m.checked_entry_at(<uint32_t>loc, n)     # its block's crc, once per block
            if p != NULL:
                self.crc_fresh = m.crc_fresh
                return p
            if loc >> 63:
                # a journal segment mapped before this record was written: map it again
                self.el.forget(loc >> 32)
                self.last_log = None
                continue
            # compaction may have moved the entry and deleted its old log since the page
            # was read (a held copy): look the location up in the index again
            locs = self._page_locs(page_no, True)
            if locs == NULL or locs[eid & 1023] == loc:
                break
        raise CorruptedDataError(
            f"index of ledger {ledger_name(self.scope, self.lid)} points entry {eid} at {loc:#x}, "
            "where no entry is")

    cdef const uint8_t *_locate_logged(self, int64_t eid, Py_ssize_t *n) except NULL:
        """_locate for a scan's entry the memtables do not hold: the page held from the
        last step (or the index's cached page) and the entry log last used first."""
        cdef int64_t page_no = eid >> 10
        cdef uint64_t loc = 0
        cdef const uint8_t *p = NULL
        cdef MappedLog m
        if page_no != self.held_page_no:
            page = self.idx.pages.get(page_no)    # once per 1024 entries of a scan
            if page is not None:
                self._hold(page, page_no)
        if page_no == self.held_page_no:
            loc = self.held_locs[eid & 1023]
        if loc != 0:
            m = self.last_log
            if m is not None and m.log_id == (loc >> 32) and m.base != NULL:
                p = m.checked_entry_at(<uint32_t>loc, n)
                self.crc_fresh = m.crc_fresh
        if p == NULL:
            # the careful path (page load, other log, ...); the next step takes the page
            # from the index again, as this one may be an evicted copy older than the entry
            self.held_page_no = -1
            return self._locate(eid, n)
        return p

    cdef object _read(self, int64_t eid):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self._locate(eid, &n)
        return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key,
                              self.crc_fresh)

    cdef int _check(self, int64_t first, int64_t last) except -1:
        if first < 0 or last < first:
            raise IllegalOpError(f"bad entry range {first}..{last}")
        if last > self.lac:
            raise NoSuchEntryError(
                f"entry {last} of ledger {ledger_name(self.scope, self.lid)} is past the LAC ({self.lac})")
        return 0

    def read_entry(self, int64_t entry_id):
        """The payload of one entry (bytes), its digest checked."""
        self._check(entry_id, entry_id)
        self.reads += 1
        return self._read(entry_id)

    def read_batch(self, int64_t first, int64_t last):
        """Payloads of first..last inclusive (list of bytes): the fast scan path."""
        self._check(first, last)
        cdef Py_ssize_t i, count = last - first + 1
        cdef list out = PyList_New(count)
        cdef object item
        if self.mt.holds_range(self.scope, self.lid, first, last) or \
                self.mt2.holds_range(self.scope, self.lid, first, last):
            for i in range(count):
                item = self._read(first + i)
                Py_INCREF(item)
                PyList_SET_ITEM(out, i, item)
        else:
            # none in the memtables when the scan began: entries only move from memtables to
            # logs, so each is looked up in the index first (a miss falls back to _locate)
            for i in range(count):
                item = self._read_logged(first + i)
                Py_INCREF(item)
                PyList_SET_ITEM(out, i, item)
        self.reads += count
        return out

    def encoded_entry(self, int64_t entry_id):
        """One entry as stored (bytes, digest not checked: the wire's reader checks it), at
        any id the bookie holds, past the LAC too (recovery reads)."""
        cdef Py_ssize_t n = 0
        if entry_id < 0:
            raise IllegalOpError(f"bad entry id {entry_id}")
        cdef const uint8_t *p = self._locate(entry_id, &n)
        self.reads += 1
        return p[:n]

    def encoded_run(self, int64_t first, int64_t count, Py_ssize_t max_bytes):
        """(k, bytearray): entries first.. as stored, each framed ``entry_id:i64 size:u32
        entry`` (the READ response's grammar), at most ``count`` of them and while the framed
        bytes stay within ``max_bytes`` (the first always goes). The run ends at the first id
        the bookie does not hold; NoSuchEntryError if that is ``first``."""
        if first < 0 or count < 1 or first > (<int64_t>1 << 62):
            raise IllegalOpError(f"bad read range: first {first}, count {count}")
        cdef bytearray out = bytearray()
        cdef Py_ssize_t n = 0, used = 0, k = 0
        cdef const uint8_t *p
        cdef uint8_t *dst
        cdef int64_t eid
        for eid in range(first, first + count):
            try:
                p = self._locate(eid, &n)
            except NoSuchEntryError:
                if k == 0:
                    raise
                break
            if k and used + 12 + n > max_bytes:
                break
            # _locate's pointer stays valid while the GIL is held: growing the buffer
            # neither releases it nor moves the entry
            PyByteArray_Resize(out, used + 12 + n)
            dst = <uint8_t *>PyByteArray_AS_STRING(out) + used
            el_put64(dst, <uint64_t>eid)
            el_put32(dst + 8, <uint32_t>n)
            memcpy(dst + 12, p, n)
            used += 12 + n
            k += 1
        self.reads += k
        return k, out

    cdef object _read_logged(self, int64_t eid):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self._locate_logged(eid, &n)
        return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key,
                              self.crc_fresh)

    def read_arrays(self, int64_t first, int64_t last):
        """(offsets int32[n + 1], values uint8[m]): the payloads of first..last, every
        digest checked, copied once into one buffer: the two buffers of a
        pyarrow.BinaryArray, with no Python object per entry."""
        import numpy as np
        self._check(first, last)
        if self.digest == DIGEST_MAC:            # hashing may release the GIL: entry by entry
            items = self.read_batch(first, last)
            sizes = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
            offsets = np.zeros(len(items) + 1, dtype=np.int64)
            np.cumsum(sizes, out=offsets[1:])
            return offsets.astype(np.int32), np.frombuffer(b"".join(items), dtype=np.uint8)
        cdef Py_ssize_t i, count = last - first + 1, n = 0, h, total = 0, cap, plen
        cdef bint logged = not (self.mt.holds_range(self.scope, self.lid, first, last) or
                                self.mt2.holds_range(self.scope, self.lid, first, last))
        cdef const uint8_t *p
        offsets = np.empty(count + 1, dtype=np.int32)
        cdef int32_t[::1] offs = offsets
        values = bytearray()
        cap = 0
        offs[0] = 0
        for i in range(count):
            # each payload is copied as soon as it is found and checked: a lookup that
            # loads an index page or maps a log releases the GIL, after which an earlier
            # pointer could be stale
            p = self._locate_logged(first + i, &n) if logged else self._locate(first + i, &n)
            h = check_entry(p, n, self.scope, self.lid, first + i, self.digest, self.mac_key,
                            self.crc_fresh)
            plen = n - h
            if total + plen > MAX_VALUES:
                raise IllegalOpError(f"payloads of entries {first}..{last} pass 2 GiB, more "
                                     "than one BinaryArray holds: read a shorter range")
            if total + plen > cap:
                cap = max(2 * cap, total + plen, (plen + 16) * count)
                PyByteArray_Resize(values, cap)
            memcpy(<uint8_t *>PyByteArray_AS_STRING(values) + total, p + h, plen)
            total += plen
            offs[i + 1] = <int32_t>total
        PyByteArray_Resize(values, total)
        self.reads += count
        return offsets, np.frombuffer(values, dtype=np.uint8)

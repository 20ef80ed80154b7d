# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The read fast path: one C-level call per read, from memtable or entry log.

A LedgerReader holds the bookie's memtable, entry logger and the ledger's index
and reads without the bookie lock. That is safe because each read runs under
the GIL from lookup to the bytes it returns, without releasing it between
taking a pointer and copying out, while every writer step leaves a state a
reader can use: a memtable flush sets index locations before it clears the
memtable, and a sealed log is unmapped before it is dropped (a reader then
maps it again read-only).
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
cimport numpy as cnp

from embedlog._native.format cimport decode_payload
from embedlog._native.memtable cimport MemTable
from embedlog._native.entrylog cimport EntryLogger, MappedLog
from embedlog._native.index cimport LedgerIndex

from embedlog.errors import CorruptedDataError, IllegalOpError, NoSuchEntryError

cnp.import_array()


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
    cdef object cur_page              # the index page last used, and its number
    cdef int64_t cur_page_no
    cdef const uint64_t *cur_locs
    cdef readonly Py_ssize_t reads

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
        self.cur_page = None
        self.cur_page_no = -1
        self.cur_locs = NULL
        self.reads = 0

    cdef bint _use_page(self, int64_t page_no) except -1:
        page = self.idx.pages.get(page_no)
        if page is None:
            page = self.idx._page(page_no, False)
            if page is None:
                return False
        self.cur_page = page
        self.cur_page_no = page_no
        self.cur_locs = <const uint64_t *>cnp.PyArray_DATA(page)
        return True

    cdef object _read(self, int64_t eid):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.mt.get(self.scope, self.lid, eid, &n)
        cdef uint64_t loc = 0
        if p == NULL:
            p = self.mt2.get(self.scope, self.lid, eid, &n)   # the other memtable (active or flushing)
        cdef int64_t page_no = eid >> 10
        cdef MappedLog m
        cdef int attempt
        if p != NULL:
            return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key)
        for attempt in range(3):
            loc = 0
            if page_no == self.cur_page_no and self.cur_page is not None:
                loc = self.cur_locs[eid & 1023]
            if loc == 0:
                # not cached, or the cached page is an evicted clean copy: ask the index
                if self._use_page(page_no):
                    loc = self.cur_locs[eid & 1023]
                if loc == 0:
                    p = self.mt.get(self.scope, self.lid, eid, &n)   # flushed meanwhile?
                    if p == NULL:
                        p = self.mt2.get(self.scope, self.lid, eid, &n)
                    if p != NULL:
                        return decode_payload(p, n, self.scope, self.lid, eid, self.digest,
                                              self.mac_key)
                    raise NoSuchEntryError(f"no entry {eid} in ledger ({self.scope}, {self.lid})")
            m = self.last_log
            if m is None or m.log_id != (loc >> 32) or m.base == NULL:
                m = self.el._log(loc >> 32)
                self.last_log = m
            p = NULL
            if m is not None:
                p = m.entry_at(<uint32_t>loc, &n)
            if p != NULL:
                return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key)
            # compaction may have moved the entry and deleted its old log since this page
            # copy was taken (an evicted page): look the location up in the index again
            self.cur_page = None
            self.cur_page_no = -1
            if not self._use_page(page_no) or self.cur_locs[eid & 1023] == loc:
                break
        raise CorruptedDataError(
            f"index of ledger ({self.scope}, {self.lid}) points entry {eid} at {loc:#x}, "
            "where no entry is")

    cdef int _check(self, int64_t first, int64_t last) except -1:
        if first < 0 or last < first:
            raise IllegalOpError(f"bad entry range {first}..{last}")
        if last > self.lac:
            raise NoSuchEntryError(
                f"entry {last} of ledger ({self.scope}, {self.lid}) is past the LAC ({self.lac})")
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
        for i in range(count):
            item = self._read(first + i)
            Py_INCREF(item)
            PyList_SET_ITEM(out, i, item)
        self.reads += count
        return out

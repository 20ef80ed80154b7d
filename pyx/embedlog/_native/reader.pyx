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
    cdef EntryLogger el
    cdef LedgerIndex idx
    cdef readonly uint64_t scope
    cdef readonly uint64_t lid
    cdef int digest
    cdef object mac_key
    cdef public int64_t lac
    cdef MappedLog last_log
    cdef readonly Py_ssize_t reads

    def __init__(self, MemTable mt, EntryLogger el, LedgerIndex idx, uint64_t scope,
                 uint64_t lid, int digest, mac_key, int64_t lac):
        self.mt = mt
        self.el = el
        self.idx = idx
        self.scope = scope
        self.lid = lid
        self.digest = digest
        self.mac_key = mac_key
        self.lac = lac
        self.last_log = None
        self.reads = 0

    cdef object _read(self, int64_t eid):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.mt.get(self.scope, self.lid, eid, &n)
        cdef uint64_t loc
        cdef MappedLog m
        if p != NULL:
            return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key)
        page = self.idx.pages.get(eid >> 10)
        if page is None:
            page = self.idx._page(eid >> 10, False)
            if page is None:
                raise NoSuchEntryError(f"no entry {eid} in ledger ({self.scope}, {self.lid})")
        loc = (<uint64_t *>cnp.PyArray_DATA(page))[eid & 1023]
        if loc == 0:
            raise NoSuchEntryError(f"no entry {eid} in ledger ({self.scope}, {self.lid})")
        m = self.last_log
        if m is None or m.log_id != (loc >> 32) or m.base == NULL:
            m = self.el._log(loc >> 32)
            self.last_log = m
        if m is not None:
            p = m.entry_at(<uint32_t>(loc & 0xFFFFFFFF), &n)
        if p == NULL:
            raise CorruptedDataError(
                f"index of ledger ({self.scope}, {self.lid}) points entry {eid} at {loc:#x}, "
                "where no entry is")
        return decode_payload(p, n, self.scope, self.lid, eid, self.digest, self.mac_key)

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

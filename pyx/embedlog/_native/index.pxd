cimport numpy as cnp
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

cdef class LedgerIndex:
    cdef readonly uint64_t scope
    cdef readonly uint64_t lid
    cdef readonly object path
    cdef readonly object root         # current/ of the ledger directory holding the file
    cdef public object master_key
    cdef public bint fenced
    cdef public uint64_t term
    cdef public int64_t incarnation   # the ledger's metadata ctime_ms, -1: not known
    cdef public int64_t explicit_lac
    cdef public bint header_dirty
    cdef readonly bint deleted
    cdef readonly dict pages          # page no -> uint64 array of 1024 locations
    cdef const uint64_t **page_locs   # the data of the same pages by number (NULL: not in
    cdef Py_ssize_t npage_locs        # memory): the read path's lookup, no Python object
    cdef readonly set dirty_pages
    cdef readonly int64_t max_page_on_disk
    cdef readonly int64_t disk_end    # bytes of the file its pages reach (the last may be short)
    cdef uint32_t page_loads[64]      # pages put into ``pages``, by page number mod 64:
                                      # a load that raced with another of its page reads again
    cdef IndexCache cache
    cdef public object lac_body       # the last WRITE_LAC body (bytes) or None; last: the
                                      # fields above keep their offsets for reader.pyx
    cdef bytes _header_bytes(self)
    cdef _set_disk_end(self, int64_t end)
    cdef object _page(self, int64_t page_no, bint create, bint dirty=*)
    cpdef uint64_t get_location(self, int64_t eid)
    cdef bint _evict(self, int64_t page_no)
    cdef int _set_page_locs(self, int64_t page_no, object page) except -1

    cdef inline const uint64_t *cached_locs(self, int64_t page_no):
        """The locations of page ``page_no`` if it is in memory, else NULL; valid while
        the GIL is held and no page is loaded (loading may evict)."""
        if 0 <= page_no < self.npage_locs:
            return self.page_locs[page_no]
        page = self.pages.get(page_no)
        if page is None:
            return NULL
        return <const uint64_t *>cnp.PyArray_DATA(page)

cdef class IndexCache:
    cdef readonly object root
    cdef public object choose_root
    cdef readonly Py_ssize_t page_limit
    cdef readonly Py_ssize_t loaded
    cdef object order                 # FIFO of (LedgerIndex, page no) as loaded
    cdef readonly Py_ssize_t evictions
    cdef readonly int64_t bytes_written    # pages and headers written by every index
    cdef _loaded(self, LedgerIndex idx, int64_t page_no)
    cdef _unloaded(self, LedgerIndex idx, int64_t page_no)
    cdef _evict_some(self)

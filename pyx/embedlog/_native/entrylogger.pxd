from libc.stdint cimport uint8_t, uint64_t

from embedlog._native.entrylog cimport MappedLog

cdef class EntryLogger:
    cdef readonly object directory     # the first ledger directory
    cdef readonly list directories
    cdef public object choose_dir
    cdef dict log_dirs            # log id -> directory holding it
    cdef readonly Py_ssize_t size_limit
    cdef readonly MappedLog current
    cdef dict logs                # log id -> MappedLog
    cdef readonly dict segment_files     # segment number -> its journal file, without suffix
    cdef readonly dict current_ledgers   # (scope, ledger) -> bytes in the current log
    cdef readonly uint64_t last_log_id
    cdef public Py_ssize_t page_cache_bytes   # written bytes left in the page cache (0: all)
    cdef object _cached           # deque of [log id, start, end]: written, not yet dropped
    cdef Py_ssize_t _cached_bytes
    cdef readonly Py_ssize_t dropped_bytes
    cdef MappedLog _log(self, uint64_t log_id)
    cdef const uint8_t *locate(self, uint64_t location, Py_ssize_t *n) except? NULL
    cdef _account(self, uint64_t scope, uint64_t lid, Py_ssize_t nbytes)
    cdef _written(self, MappedLog m, Py_ssize_t start, Py_ssize_t end)
    cdef _drop(self, uint64_t log_id, long long start, long long n)

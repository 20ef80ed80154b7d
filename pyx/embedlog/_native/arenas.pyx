# cython: language_level=3
"""A cache of pymalloc's free arenas, so a scan's objects land in memory already touched.

CPython's small-object allocator takes its memory in 1 MiB arenas and hands an arena back
to the system (munmap) as soon as it is empty. A scan that builds and drops a list of
100,000 small bytes objects therefore maps, faults in and zero-fills about 16 MiB afresh
every time; on this project's VM each fresh 4 KiB page costs microseconds (PERFORMANCE.md),
which made read_batch three times slower than the same entries read into one buffer.

install() chains an arena allocator in front of the running one: a freed arena is kept
(up to a limit) and given back on the next request instead of a new mapping. It never
raises the process's peak: an arena is only cached after it was in use, and a request
takes a cached one first. pymalloc calls it with the GIL held; the mutex is for
interpreters with GILs of their own (3.12+), which share this one allocator.
"""
cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_mutex_init(pthread_mutex_t *, const void *)
cdef extern from "Python.h":
    ctypedef struct PyObjectArenaAllocator:
        void *ctx
        void *(*alloc)(void *ctx, size_t size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil
    void PyObject_GetArenaAllocator(PyObjectArenaAllocator *allocator)
    void PyObject_SetArenaAllocator(PyObjectArenaAllocator *allocator)

cdef enum:
    MAX_KEPT = 4096
    ARENA_SIZE = 1 << 20            # pymalloc's arena since CPython 3.10 (radix tree builds)

cdef PyObjectArenaAllocator _prev
cdef bint _installed = False
cdef void *_kept[MAX_KEPT]
cdef Py_ssize_t _nkept = 0, _limit = 0
cdef unsigned long long _hits = 0, _misses = 0, _returned = 0
cdef pthread_mutex_t _lock
pthread_mutex_init(&_lock, NULL)


cdef void *_alloc(void *ctx, size_t size) noexcept nogil:
    global _nkept, _hits, _misses
    cdef void *p = NULL
    pthread_mutex_lock(&_lock)
    if _nkept > 0 and size == ARENA_SIZE:
        _nkept -= 1
        _hits += 1
        p = _kept[_nkept]
    elif size == ARENA_SIZE:
        _misses += 1
    pthread_mutex_unlock(&_lock)
    return p if p != NULL else _prev.alloc(_prev.ctx, size)


# other sizes pass through: 3.11's frame stack chunks come from this allocator too
cdef void _free(void *ctx, void *ptr, size_t size) noexcept nogil:
    global _nkept, _returned
    cdef bint kept = False
    if ptr == NULL:
        return
    pthread_mutex_lock(&_lock)
    if _nkept < _limit and size == ARENA_SIZE:
        _kept[_nkept] = ptr
        _nkept += 1
        kept = True
    elif size == ARENA_SIZE:
        _returned += 1
    pthread_mutex_unlock(&_lock)
    if not kept:
        _prev.free(_prev.ctx, ptr, size)


def install(Py_ssize_t limit_bytes):
    """Keep up to limit_bytes of free arenas; 0 gives the kept ones back and leaves
    CPython's behaviour. Idempotent."""
    global _installed, _limit, _nkept
    cdef PyObjectArenaAllocator mine
    if limit_bytes < 0:
        raise ValueError(f"limit_bytes is not negative, got {limit_bytes}")
    _limit = min(MAX_KEPT, limit_bytes // ARENA_SIZE)
    while _nkept > _limit:               # a lower limit gives the surplus back now
        _nkept -= 1
        _prev.free(_prev.ctx, _kept[_nkept], ARENA_SIZE)   # the GIL keeps pymalloc away
    if not _installed and _limit > 0:
        PyObject_GetArenaAllocator(&_prev)
        mine.ctx = NULL
        mine.alloc = _alloc
        mine.free = _free
        PyObject_SetArenaAllocator(&mine)
        _installed = True


def stats():
    """{'kept', 'kept_bytes', 'limit', 'hits', 'misses', 'returned'}: arenas held now, how
    many requests the cache served and missed, and arenas given back past the limit."""
    return {"kept": _nkept, "kept_bytes": _nkept * ARENA_SIZE, "limit": _limit,
            "hits": _hits, "misses": _misses, "returned": _returned}

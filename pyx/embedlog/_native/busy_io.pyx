# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""enable_busy_wait (BookKeeper's enableBusyWait): the group leader's O_DIRECT write and
fdatasync done by a thread of their own while the leader spins, so the leader's core never
sleeps in the I/O.

Why: on this kind of VM the Python that follows a sleep in a write or an fdatasync runs
about twice as slowly as the same code on a core that did not sleep (docs/PERFORMANCE.md,
"Where the floors stand"); a lone durable append is mostly that Python. The price is CPU:
the leader spins while its I/O is under way, and the I/O thread spins for IDLE_SPIN_NS
after each request waiting for the next one, then sleeps. A leader that finds it asleep
does its I/O itself (no wake-up to wait for) and wakes it for the next one.

Bounds: a request names a JournalBuffer, which lays its whole blocks out (direct_blocks)
before the thread is told; one leader at a time (the journal's ``_syncing``); a leader
that has spun SPIN_NS gives its core away between looks (a descheduled I/O thread)."""

from libc.stdint cimport uint8_t
from libc.stdlib cimport malloc, free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from embedlog._native.journal_buffer cimport JournalBuffer, write_and_sync


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t *, void *, void *(*)(void *) noexcept nogil, void *)
    int pthread_join(pthread_t, void **)
    int pthread_mutex_init(pthread_mutex_t *, void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_cond_init(pthread_cond_t *, void *)
    int pthread_cond_destroy(pthread_cond_t *)
    int pthread_cond_signal(pthread_cond_t *)
    int pthread_cond_wait(pthread_cond_t *, pthread_mutex_t *)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from *:
    """
    static inline int el_phase(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void el_set_phase(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int el_move_phase(int *p, int from, int to) {
        return __atomic_compare_exchange_n(p, &from, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline void el_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #endif
    }
    """
    int el_phase(const int *p) nogil
    void el_set_phase(int *p, int v) nogil
    int el_move_phase(int *p, int from_, int to) nogil
    void el_relax() nogil

cdef enum:
    SLEEPING = 0     # the thread waits on ``cond``: leaders write for themselves
    READY = 1        # the thread spins, waiting for a request
    REQUEST = 2      # a leader posted one
    DONE = 3         # the thread finished it; the leader reads the result
    STOP = 4

DEF IDLE_SPIN_NS = 200000        # the thread's spin after a request: a lone appender's next
                                 # group comes some 20-40 us later
DEF SPIN_NS = 2000000            # a leader spinning longer yields its core between looks


cdef struct busy_state:
    pthread_mutex_t mu
    pthread_cond_t cond
    int phase
    int fd
    const uint8_t *data
    Py_ssize_t nbytes
    long long offset
    int err
    long long sync_ns


cdef long long _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef void _write_sync(busy_state *s) noexcept nogil:
    """The request: the blocks, then fdatasync (its time kept for the journal's stats)."""
    s.err = write_and_sync(s.fd, s.data, s.nbytes, s.offset, &s.sync_ns)


cdef void *_serve(void *arg) noexcept nogil:
    cdef busy_state *s = <busy_state *>arg
    cdef long long since = _now_ns()
    cdef int phase
    while True:
        phase = el_phase(&s.phase)
        if phase == REQUEST:
            _write_sync(s)
            el_set_phase(&s.phase, DONE)
            since = _now_ns()
        elif phase == STOP:
            return NULL
        elif phase == READY and _now_ns() - since > IDLE_SPIN_NS:
            pthread_mutex_lock(&s.mu)
            if el_move_phase(&s.phase, READY, SLEEPING):
                while el_phase(&s.phase) == SLEEPING:
                    pthread_cond_wait(&s.cond, &s.mu)
            pthread_mutex_unlock(&s.mu)
            since = _now_ns()
        else:
            el_relax()


cdef class BusyWriter:
    """One journal's I/O thread (module doc); ``close`` stops it."""
    cdef busy_state *s
    cdef pthread_t thread
    cdef bint running
    cdef readonly long long handed       # requests the thread did
    cdef readonly long long done_here    # requests a leader did itself (the thread asleep)

    def __cinit__(self):
        self.s = <busy_state *>malloc(sizeof(busy_state))
        if self.s == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.s.mu, NULL)
        pthread_cond_init(&self.s.cond, NULL)
        self.s.phase = READY
        if pthread_create(&self.thread, NULL, _serve, self.s) != 0:
            pthread_cond_destroy(&self.s.cond)
            pthread_mutex_destroy(&self.s.mu)
            free(self.s)
            self.s = NULL
            raise OSError("cannot start the journal's busy-wait thread")
        self.running = True

    @property
    def sleeping(self) -> bool:
        """Whether the thread waits to be woken (a leader then does its I/O itself)."""
        return self.s != NULL and el_phase(&self.s.phase) == SLEEPING

    def write_direct_sync(self, JournalBuffer buf, int fd, long long offset, bytes tail):
        """JournalBuffer.write_direct then fdatasync of ``fd``, by the thread if it is
        spinning (this thread spins meanwhile), else here. Returns (the new tail, the
        fdatasync's seconds); raises OSError as the write or the sync failed."""
        cdef Py_ssize_t end, padded
        cdef busy_state *s = self.s
        cdef long long t0
        cdef bint here
        if not self.running:
            raise ValueError("busy writer closed")
        if el_phase(&s.phase) in (REQUEST, DONE):
            raise RuntimeError("busy writer: one request at a time")
        buf.direct_blocks(offset, tail, &end, &padded)
        s.fd = fd
        s.data = buf.base
        s.nbytes = padded
        s.offset = offset - (end - buf.size)
        with nogil:
            here = not el_move_phase(&s.phase, READY, REQUEST)
            if here:
                _write_sync(s)
                pthread_mutex_lock(&s.mu)
                if el_phase(&s.phase) == SLEEPING:
                    el_set_phase(&s.phase, READY)
                    pthread_cond_signal(&s.cond)
                pthread_mutex_unlock(&s.mu)
            else:
                t0 = _now_ns()
                while el_phase(&s.phase) != DONE:
                    if _now_ns() - t0 > SPIN_NS:
                        sched_yield()
                    else:
                        el_relax()
                el_set_phase(&s.phase, READY)
        if here:
            self.done_here += 1
        else:
            self.handed += 1
        if s.err:
            raise OSError(s.err, "journal write or sync failed")
        return buf.tail_after(end), s.sync_ns / 1e9

    def close(self):
        """Stop the thread (idempotent)."""
        self._stop()

    cdef void _stop(self) noexcept:
        if not self.running:
            return
        self.running = False
        with nogil:
            while True:         # a request under way (a leader racing a close) ends first
                pthread_mutex_lock(&self.s.mu)
                if el_move_phase(&self.s.phase, READY, STOP) or \
                        el_move_phase(&self.s.phase, SLEEPING, STOP):
                    pthread_cond_signal(&self.s.cond)
                    pthread_mutex_unlock(&self.s.mu)
                    break
                pthread_mutex_unlock(&self.s.mu)
                sched_yield()
            pthread_join(self.thread, NULL)

    def __dealloc__(self):
        if self.s == NULL:
            return
        self._stop()
        pthread_cond_destroy(&self.s.cond)
        pthread_mutex_destroy(&self.s.mu)
        free(self.s)

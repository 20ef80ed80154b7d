# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Durability waiters: ``DurableSeq`` tells threads outside the bookie's lock how far the
journal is durable, and lets them sleep without the GIL until their group is (the leader of
a group commit publishes; bookie/journal.py's ``wait_durable`` waits).

Bounds: a publish signals at most MAX_SIGNALS waiters after unlocking (the rest before);
waiter slots are kept for reuse, so a late signal always finds a live condition.
"""

from libc.stdint cimport uint64_t
from libc.stdlib cimport malloc, free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.types cimport clockid_t


cdef extern from "native.h" nogil:
    uint64_t el_load_acquire(const uint64_t *p)
    void el_store_release(uint64_t *p, uint64_t v)


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef struct pthread_condattr_t:
        pass
    int pthread_condattr_init(pthread_condattr_t *)
    int pthread_condattr_setclock(pthread_condattr_t *, clockid_t)
    int pthread_condattr_destroy(pthread_condattr_t *)
    int pthread_mutex_init(pthread_mutex_t *, void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_cond_init(pthread_cond_t *, pthread_condattr_t *)
    int pthread_cond_destroy(pthread_cond_t *)
    int pthread_cond_signal(pthread_cond_t *)
    int pthread_cond_timedwait(pthread_cond_t *, pthread_mutex_t *, const timespec *)


cdef struct Waiter:
    pthread_cond_t cond          # its own, so a publish wakes only those it concerns
    uint64_t seq
    bint woken
    Waiter *next                 # in the waiting list or the spare list


cdef void _free_waiters(Waiter *w) noexcept nogil:
    cdef Waiter *nxt
    while w != NULL:
        nxt = w.next
        pthread_cond_destroy(&w.cond)
        free(w)
        w = nxt


DEF MAX_SIGNALS = 64             # waiters a publish wakes after unlocking (the rest before)


cdef class DurableSeq:
    """How far the journal is durable, for waiters outside the bookie's lock: a waiter
    whose group is being synced sleeps here without the GIL. The leader's ``publish`` wakes
    the waiters its group covers and one it does not (the lowest seq: the next group
    needs a leader), not everyone: with 16 appending threads, waking those of the next group
    too sent each of them through the GIL for nothing, a context switch or two per add.
    ``epoch`` moves on every publish and ``wake``, so a waiter that looked at the journal
    before a publish and sleeps after it returns at once and looks again; ``wake`` (a
    failed group, a close) wakes everyone."""
    cdef pthread_mutex_t mu
    cdef uint64_t _synced
    cdef uint64_t _epoch
    cdef Waiter *waiting
    cdef Waiter *spare           # slots are kept: a late signal must find a live cond

    def __cinit__(self):
        pthread_mutex_init(&self.mu, NULL)
        self._synced = 0
        self._epoch = 0
        self.waiting = NULL
        self.spare = NULL

    def __dealloc__(self):
        _free_waiters(self.waiting)         # none: a waiter holds a reference to self
        _free_waiters(self.spare)
        pthread_mutex_destroy(&self.mu)

    @property
    def synced(self):
        return el_load_acquire(&self._synced)

    @property
    def epoch(self):
        return el_load_acquire(&self._epoch)

    @property
    def nwaiting(self):
        """Waiters asleep now (for tests)."""
        cdef Waiter *w
        cdef int n = 0
        with nogil:
            pthread_mutex_lock(&self.mu)
            w = self.waiting
            while w != NULL:
                n += 1
                w = w.next
            pthread_mutex_unlock(&self.mu)
        return n

    def publish(self, uint64_t synced):
        """The journal is durable up to ``synced``: wake the waiters it covers and the
        first one it does not. Keeps the GIL: the leader calls it holding the bookie's lock,
        and a GIL let go there hands it to appenders that then queue on that lock (no waiter
        takes the GIL while it holds ``mu``, so this cannot deadlock)."""
        self._publish(synced, False)

    def wake(self):
        """Something changed that waiters must look at (a failed group, a close)."""
        self._publish(0, True)

    cdef void _publish(self, uint64_t synced, bint everyone) noexcept nogil:
        cdef Waiter *signal[MAX_SIGNALS]
        cdef int n = 0, i
        cdef Waiter **link
        cdef Waiter **first_link = NULL
        cdef Waiter *w
        pthread_mutex_lock(&self.mu)
        if synced > self._synced:
            el_store_release(&self._synced, synced)
        el_store_release(&self._epoch, self._epoch + 1)
        link = &self.waiting
        while link[0] != NULL:
            w = link[0]
            if everyone or w.seq <= self._synced:
                link[0] = w.next
                self._woken(w, signal, &n)
                continue
            if first_link == NULL or w.seq < first_link[0].seq:
                first_link = link
            link = &w.next
        if first_link != NULL:
            w = first_link[0]
            first_link[0] = w.next
            self._woken(w, signal, &n)
        pthread_mutex_unlock(&self.mu)
        # outside the lock, so the woken do not queue on it behind the publisher; a slot
        # reused meanwhile gets a spurious wake-up, which its waiter sleeps through
        for i in range(n):
            pthread_cond_signal(&signal[i].cond)

    cdef inline void _woken(self, Waiter *w, Waiter **signal, int *n) noexcept nogil:
        w.woken = True
        if n[0] < MAX_SIGNALS:
            signal[n[0]] = w
            n[0] += 1
        else:
            pthread_cond_signal(&w.cond)

    def wait(self, uint64_t seq, uint64_t epoch, double timeout_s):
        """Sleep until a publish covers ``seq`` or picks this waiter to lead, a ``wake``,
        or ``timeout_s``; returns at once if the epoch moved past ``epoch``. Returns
        whether ``seq`` is durable."""
        cdef timespec ts
        cdef bint reached
        cdef Waiter *w
        cdef Waiter **link
        cdef pthread_condattr_t attr
        clock_gettime(CLOCK_MONOTONIC, &ts)
        ts.tv_sec += <long>timeout_s
        ts.tv_nsec += <long>((timeout_s - <long>timeout_s) * 1e9)
        if ts.tv_nsec >= 1000000000:
            ts.tv_sec += 1
            ts.tv_nsec -= 1000000000
        with nogil:
            pthread_mutex_lock(&self.mu)
            if self._synced < seq and self._epoch == epoch:
                w = self.spare
                if w != NULL:
                    self.spare = w.next
                else:
                    w = <Waiter *>malloc(sizeof(Waiter))
                    if w != NULL:
                        pthread_condattr_init(&attr)
                        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)   # a wall-clock step moves no wait
                        pthread_cond_init(&w.cond, &attr)
                        pthread_condattr_destroy(&attr)
                if w != NULL:
                    w.seq = seq
                    w.woken = False
                    w.next = self.waiting
                    self.waiting = w
                    while not w.woken:
                        if pthread_cond_timedwait(&w.cond, &self.mu, &ts) != 0:
                            break   # timed out (the caller looks at its deadline)
                    if not w.woken:
                        link = &self.waiting
                        while link[0] != w:
                            link = &link[0].next
                        link[0] = w.next
                    w.next = self.spare
                    self.spare = w
            reached = self._synced >= seq
            pthread_mutex_unlock(&self.mu)
        return reached

# cython: language_level=3
"""One writer's messages between produce() and their delivery.

A call of add() copies its payload into the staged batch and gives it the next entry id;
no Python object is kept per message. The writer's drainer (the embedded handle's flusher
thread, the client's event loop) takes the staged batch whole, frames it with one journal
add or one ADD frame per bookie, and reports each batch's outcome as a range of ids.

Layout (every size in bytes, every count in messages):

    data       := taken[0 .. head) staged[0 .. count)       payloads back to back
    ends       := int64 ends[head + count]   ends[j] = end offset in data of payload j
    staged i   := data[start_i, ends[head + i]), start_0 = data_head = ends[head - 1] (0 at
                  head 0), start_i = ends[head + i - 1]
    ids        := staged i is entry first_id + i;  next_id = first_id + count
    in flight  := staged messages and taken ones whose range was not yet settled

A take moves ``head`` past what it took (no copy); the taken prefix is dropped by one
memmove when the buffers are full and it is at least as large as what is staged, or at
once when the queue empties, so each add's share of the copying is bounded.

Bounds, checked before anything is written:

    0 <= len(prefix) + len(payload) <= entry_max_bytes   (each checked before the sum)
    in_flight_messages + 1 <= max_messages        else BufferError (queue full)
    in_flight_bytes + len(payload) <= max_bytes   else BufferError (one message larger
                                                  than max_bytes: EntryTooLargeError)
    next_id <= id_max                             else IllegalOpError
    1 <= max_messages <= MAX_MESSAGES, 1 <= max_bytes <= MAX_BYTES: staged count and
    bytes never pass them, and the taken prefix kept is smaller than what is staged, so ends
    never grow past 2 x max_messages entries nor data past 2 x max_bytes

Waking the drainer: ``kick`` (a callable) is called once when a message is added while
the queue is *armed*; only a take(arm=True) that found nothing arms it (the drainer is
about to sleep), and the kick disarms it. So there is exactly one kick per sleep: a
drainer that sleeps on a lock released by the kick never sees the lock released twice.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memmove

from embedlog.errors import EntryTooLargeError, IllegalOpError

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX
    bint PyBytes_CheckExact(object o)
    char *PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)

cdef enum:
    MAX_MESSAGES = 1 << 26          # ends: 512 MiB at most
    MIN_CAPACITY = 64

cdef Py_ssize_t MAX_BYTES = 1 << 40
cdef int64_t ID_LIMIT = (1 << 63) - 2


cdef class ProduceQueue:
    cdef uint8_t *data
    cdef Py_ssize_t data_capacity
    cdef int64_t *ends
    cdef Py_ssize_t ends_capacity
    cdef Py_ssize_t count                    # staged messages
    cdef Py_ssize_t head                     # index in ends of staged message 0
    cdef Py_ssize_t data_head                # offset in data of staged message 0
    cdef int64_t first_id                    # entry id of staged message 0
    cdef readonly Py_ssize_t max_messages
    cdef readonly Py_ssize_t max_bytes
    cdef readonly Py_ssize_t entry_max_bytes
    cdef readonly int64_t id_max
    cdef readonly Py_ssize_t in_flight_messages
    cdef readonly Py_ssize_t in_flight_bytes
    cdef readonly bint armed
    cdef public object kick

    def __cinit__(self, int64_t first_id, Py_ssize_t max_messages, Py_ssize_t max_bytes,
                  Py_ssize_t entry_max_bytes, int64_t id_max=ID_LIMIT, kick=None):
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise IllegalOpError(f"queue_buffering_max_messages is 1 .. {MAX_MESSAGES}, "
                                 f"got {max_messages}")
        if not 1 <= max_bytes <= MAX_BYTES:
            raise IllegalOpError(f"queue_buffering_max_bytes is 1 .. {MAX_BYTES}, got {max_bytes}")
        if entry_max_bytes < 0:
            raise IllegalOpError(f"entry_max_bytes is not negative, got {entry_max_bytes}")
        if not 0 <= first_id or id_max > ID_LIMIT:
            raise IllegalOpError(f"entry ids are 0 .. {ID_LIMIT}, got {first_id} .. {id_max}")
        self.first_id = first_id
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.entry_max_bytes = entry_max_bytes
        self.id_max = id_max
        self.armed = True
        self.kick = kick

    def __dealloc__(self):
        free(self.data)
        free(self.ends)

    @property
    def next_id(self) -> int:
        """The id the next message gets."""
        return self.first_id + self.count

    @property
    def staged(self) -> int:
        return self.count

    @property
    def staged_bytes(self) -> int:
        return self._used() - self.data_head

    cdef inline Py_ssize_t _used(self) noexcept:
        return self.ends[self.head + self.count - 1] if self.count else self.data_head

    cdef void _compact(self) noexcept:
        # drop the taken prefix: staged messages move to the front of data and ends
        cdef Py_ssize_t i, used = self._used(), base = self.data_head
        if self.head == 0:
            return
        if used > base:
            memmove(self.data, self.data + base, used - base)
        for i in range(self.count):
            self.ends[i] = self.ends[self.head + i] - base
        self.head = 0
        self.data_head = 0

    cdef int _grow(self, Py_ssize_t nbytes) except -1:
        # room for one more message of nbytes. Staged count and bytes stay within max_messages
        # and max_bytes (the callers' bounds) and the taken prefix kept is smaller than the
        # staged part (else it is compacted away first), so neither size passes twice its bound
        cdef Py_ssize_t used = self._used()
        cdef Py_ssize_t cap
        cdef void *p
        if self.head and (self.head + self.count >= self.ends_capacity or
                          used + nbytes > self.data_capacity) and \
                (self.head >= self.count or self.data_head >= used - self.data_head):
            self._compact()
            used = self._used()
        if self.head + self.count >= self.ends_capacity:
            cap = max(MIN_CAPACITY, 2 * self.ends_capacity)
            cap = min(cap, 2 * self.max_messages)
            p = realloc(self.ends, cap * sizeof(int64_t))
            if p == NULL:
                raise MemoryError()
            self.ends = <int64_t *>p
            self.ends_capacity = cap
        if used + nbytes > self.data_capacity:
            cap = max(MIN_CAPACITY * 64, 2 * self.data_capacity, used + nbytes)
            cap = min(cap, 2 * self.max_bytes)
            p = realloc(self.data, cap)
            if p == NULL:
                raise MemoryError()
            self.data = <uint8_t *>p
            self.data_capacity = cap
        return 0

    def add(self, value, prefix=None) -> int:
        """Copy ``value`` (bytes-like) in as the next message, after ``prefix`` (bytes, or
        None: a stream's kind and time header, copied here rather than joined in Python);
        returns its entry id."""
        cdef Py_buffer view
        cdef const uint8_t *src
        cdef const uint8_t *psrc = NULL
        cdef Py_ssize_t n, used, pn = 0
        cdef int64_t eid = self.first_id + self.count
        cdef bint release = False
        if prefix is not None:
            if not PyBytes_CheckExact(prefix):
                raise IllegalOpError(f"a message's prefix is bytes, got {type(prefix).__name__}")
            psrc = <const uint8_t *>PyBytes_AS_STRING(prefix)
            pn = PyBytes_GET_SIZE(prefix)
        if PyBytes_CheckExact(value):
            src = <const uint8_t *>PyBytes_AS_STRING(value)
            n = PyBytes_GET_SIZE(value)
        else:
            if not isinstance(value, (bytearray, memoryview)):
                raise IllegalOpError(f"entries are bytes-like, got {type(value).__name__}")
            PyObject_GetBuffer(value, &view, PyBUF_SIMPLE)
            src, n, release = <const uint8_t *>view.buf, view.len, True
        try:
            # n + pn is formed only once both are known to be under entry_max_bytes
            if pn > self.entry_max_bytes or n > self.entry_max_bytes - pn:
                raise EntryTooLargeError(f"entry of {n + pn if n <= PY_SSIZE_T_MAX - pn else n} "
                                         f"bytes is over max_entry_size_bytes ({self.entry_max_bytes})")
            n += pn
            if n > self.max_bytes:
                raise EntryTooLargeError(f"entry of {n} bytes is over queue_buffering_max_bytes "
                                         f"({self.max_bytes})")
            if eid > self.id_max:
                raise IllegalOpError(f"entry id {eid} is past this ledger's last ({self.id_max})")
            if self.in_flight_messages >= self.max_messages or \
                    self.in_flight_bytes > self.max_bytes - n:
                raise BufferError(f"produce queue full: {self.in_flight_messages} messages, "
                                  f"{self.in_flight_bytes} bytes in flight (queue_buffering_max_"
                                  f"messages={self.max_messages}, _bytes={self.max_bytes}); "
                                  f"poll() or flush() to deliver some")
            self._grow(n)
            used = self._used()
            if pn:
                memcpy(self.data + used, psrc, pn)
            if n > pn:
                memcpy(self.data + used + pn, src, n - pn)
            self.ends[self.head + self.count] = used + n
            self.count += 1
            self.in_flight_messages += 1
            self.in_flight_bytes += n
        finally:
            if release:
                PyBuffer_Release(&view)
        if self.armed and self.kick is not None:
            self.armed = False
            self.kick()
        return eid

    cdef Py_ssize_t _fitting(self, Py_ssize_t max_bytes, bint arm, Py_ssize_t max_count):
        # how many staged messages from the first fit in max_bytes (at least one) and
        # max_count; 0 when none is staged (arming the kick if asked)
        cdef Py_ssize_t k = 0
        cdef Py_ssize_t most = self.count if max_count < 0 or max_count > self.count else max_count
        cdef int64_t *ends = self.ends + self.head
        if most == 0:
            if arm and self.count == 0:
                self.armed = True
            return 0
        while k < most and (k == 0 or ends[k] - self.data_head <= max_bytes):
            k += 1
        return k

    def take(self, Py_ssize_t max_bytes, bint arm=False, Py_ssize_t max_count=-1):
        """The staged messages from the first on, as many as fit in ``max_bytes`` (at least
        one) and, given, ``max_count``: (first id, list of bytes, their bytes); they stay in
        flight until settle(). None when nothing is staged (or max_count is 0), and then,
        with ``arm``, the next add() kicks."""
        cdef Py_ssize_t k = self._fitting(max_bytes, arm, max_count), i, start, total
        cdef list out
        if k == 0:
            return None
        cdef int64_t *ends = self.ends + self.head
        cdef Py_ssize_t base = self.data_head
        out = [None] * k
        start = base
        for i in range(k):
            out[i] = PyBytes_FromStringAndSize(<char *>self.data + start, ends[i] - start)
            start = ends[i]
        total = start - base
        first = self.first_id
        self._drop(k)
        return first, out, total

    def take_packed(self, Py_ssize_t max_bytes, bint arm=False, Py_ssize_t max_count=-1):
        """take() without an object per message: (first id, (data, ends), their bytes), data
        the payloads back to back in one bytes object and ends their native int64 end
        offsets into it (journal_kernels.add_payloads takes the pair as it is)."""
        cdef Py_ssize_t k = self._fitting(max_bytes, arm, max_count), i
        if k == 0:
            return None
        cdef int64_t *ends = self.ends + self.head
        cdef Py_ssize_t base = self.data_head
        cdef Py_ssize_t total = ends[k - 1] - base
        cdef bytes data = PyBytes_FromStringAndSize(<char *>self.data + base, total)
        cdef bytes rel = PyBytes_FromStringAndSize(NULL, k * sizeof(int64_t))
        cdef int64_t *out = <int64_t *>PyBytes_AS_STRING(rel)
        for i in range(k):
            out[i] = ends[i] - base
        first = self.first_id
        self._drop(k)
        return first, (data, rel), total

    cdef void _drop(self, Py_ssize_t k) noexcept:
        # the first k staged messages leave the staged batch (in flight still): head moves
        # past them; an empty queue starts again at the front of its buffers
        self.data_head = self.ends[self.head + k - 1] if k else self.data_head
        self.head += k
        self.count -= k
        self.first_id += k
        if self.count == 0:
            self.head = self.data_head = 0

    def wake(self) -> bool:
        """Kick the drainer now if it sleeps (a close wants it to look); True if it did."""
        if self.armed and self.kick is not None:
            self.armed = False
            self.kick()
            return True
        return False

    def reserve(self, Py_ssize_t n) -> int:
        """Give the next ``n`` ids to a caller that frames them itself (append, append_many);
        returns the first, or -1 while messages are staged (take them first: ids are framed
        in order). Reserved ids are not in flight here."""
        if n < 0 or self.first_id > self.id_max + 1 - n:
            raise IllegalOpError(f"{n} entries from entry {self.first_id} pass this ledger's "
                                 f"last id ({self.id_max})")
        if self.count:
            return -1
        first = self.first_id
        self.first_id += n
        return first

    def settle(self, Py_ssize_t messages, Py_ssize_t nbytes) -> None:
        """A taken range was delivered or failed: its messages leave the in-flight count."""
        if not 0 <= messages <= self.in_flight_messages - self.count or \
                not 0 <= nbytes <= self.in_flight_bytes - (self._used() - self.data_head):
            raise IllegalOpError(f"settle of {messages} messages, {nbytes} bytes: only "
                                 f"{self.in_flight_messages - self.count} taken")
        self.in_flight_messages -= messages
        self.in_flight_bytes -= nbytes

    def discard(self):
        """Drop every staged message (the writer failed or closed): (first id, count, bytes)
        of what was dropped; they leave the in-flight count."""
        cdef Py_ssize_t k = self.count, nbytes = self._used() - self.data_head
        first = self.first_id
        self._drop(k)
        self.in_flight_messages -= k
        self.in_flight_bytes -= nbytes
        return first, k, nbytes

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The memtable: entries not yet in an entry log, without a Python object per entry.

Encoded entries are copied into one arena; a record array holds (scope, ledger, entry,
arena offset, size) and an open-addressing hash table maps the key to the newest record.
Entries are grouped in blocks of 64 consecutive ids of one ledger; a flush sorts the
blocks (not the entries) and walks their slots, so entry logs keep a ledger's entries
together in id order, as BookKeeper's SortedLedgerStorage does.

Bounds (what every size and index is checked against before a write):

- ``limit_bytes`` bounds the arena bytes plus the blocks' bytes (``used_bytes``): a block
  costs MT_BLOCK_BYTES whatever it holds, so entries whose ids step by 64 (or many
  ledgers of one entry) cannot make the blocks outgrow the arena. ``fits(n, b)`` says
  whether n more bytes and b more blocks stay within it; an empty memtable takes one
  entry of any size up to the limit (then used_bytes may pass it by that entry's block).
- records: ``prepare(nrecs, nblocks)`` makes room for that many more records and blocks
  before a kernel commits; a batch of k entries opens at most k blocks (gapped ids, many
  ledgers) and k // 64 + 2 when its ids are consecutive in one ledger. ``commit`` checks
  the record and block counts against their capacities and refuses (returns -1) instead
  of writing past them, so a wrong reservation is an error, never a heap overwrite.
- record indexes are int32 (slot = index + 1): nrecs stays below MAX_RECS.
- the hash table has at least twice as many slots as blocks, so a probe always ends.

The add path (journal_kernels.pyx's ``add_payloads`` and ``add_encoded_entries``) frames each
entry into the journal buffer and copies it into the arena in the same pass; add_payloads
does it without the GIL, after ``prepare`` made room, while readers (reader.pyx, under the
GIL, without the bookie lock) may look entries up: everything is allocated before, and
a record is complete before the slot that publishes it is set (``el_publish``).
"""

from libc.stdlib cimport malloc, realloc, free, qsort
from libc.string cimport memcpy, memset
from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize

import numpy as np
cimport numpy as cnp

from embedlog._native.format cimport (decode_payload, parse_ids, cmp_ledgers,
                                      el_crc_init, DIGEST_MAC)

cdef extern from "native.h" nogil:
    void el_publish()

from embedlog.errors import EntryTooLargeError

MT_BLOCK_BYTES = sizeof(mt_block)
cdef Py_ssize_t MAX_RECS = 0x7FFFFFFE            # slots hold record index + 1 as int32
cdef Py_ssize_t MAX_ENTRY_BYTES = 0xFFFFFFFE     # record sizes are u32; all ones is a tombstone

el_crc_init()
cnp.import_array()


cdef inline uint64_t _hash(uint64_t scope, uint64_t lid, int64_t eid) noexcept nogil:
    cdef uint64_t h = scope * 0x9E3779B97F4A7C15ULL
    h ^= lid + 0xBF58476D1CE4E5B9ULL + (h << 6) + (h >> 2)
    h ^= <uint64_t>eid * 0x94D049BB133111EBULL
    h ^= h >> 31
    return h


ctypedef struct blk_key:
    uint64_t scope
    uint64_t lid
    int64_t hi
    Py_ssize_t index


cdef int _cmp_blocks(const void *a, const void *b) noexcept nogil:
    cdef const blk_key *x = <const blk_key *>a
    cdef const blk_key *y = <const blk_key *>b
    cdef int c = cmp_ledgers(x.scope, x.lid, y.scope, y.lid)
    if c:
        return c
    if x.hi != y.hi:
        return -1 if x.hi < y.hi else 1
    return 0


cdef class MemTable:
    """Bounded in-memory table of encoded entries keyed by (scope, ledger, entry)."""

    def __cinit__(self, Py_ssize_t limit_bytes=64 << 20):
        self.limit_bytes = limit_bytes
        self.arena = NULL
        self.arena_capacity = 0
        self.arena_used = 0
        self.recs = NULL
        self.nrecs = 0
        self.recs_capacity = 0
        self.blocks = NULL
        self.nblocks = 0
        self.blocks_capacity = 0
        self.bslots = NULL
        self.nbslots = 0
        self.last_block = -1
        self.live = 0

    def __dealloc__(self):
        free(self.arena)
        free(self.recs)
        free(self.blocks)
        free(self.bslots)

    cdef bint fits(self, Py_ssize_t n, Py_ssize_t new_blocks) noexcept nogil:
        """Whether n more arena bytes and new_blocks more blocks stay within limit_bytes.
        Callers let an empty memtable (nrecs == 0) take one entry whatever this says, so
        any entry up to limit_bytes is taken (its block may pass the limit)."""
        if n < 0 or new_blocks < 0 or n > self.limit_bytes:
            return False
        return (self.arena_used + n + (self.nblocks + new_blocks) * <Py_ssize_t>sizeof(mt_block)
                <= self.limit_bytes)

    cdef bint opens_block(self, uint64_t scope, uint64_t lid, int64_t eid) noexcept nogil:
        """Whether an entry with these ids needs a block the memtable does not have."""
        return self._find_block(scope, lid, eid >> 6) < 0

    cdef uint8_t *reserve(self, Py_ssize_t n) noexcept nogil:
        """Room for n bytes in the arena, or NULL when the memtable is full (callers check
        fits() first; this bounds the arena itself)."""
        cdef Py_ssize_t cap
        cdef uint8_t *p
        if n < 0 or n > self.limit_bytes:
            return NULL
        if self.arena_used + n > self.limit_bytes:
            if self.arena_used > 0:
                return NULL
        if self.arena_used + n > self.arena_capacity:
            # grow towards the limit; the arena is kept across flushes
            cap = max(self.arena_capacity * 2, 1 << 20)
            while cap < self.arena_used + n:
                cap *= 2
            cap = min(cap, max(self.limit_bytes, self.arena_used + n))   # never past the limit
            p = <uint8_t *>realloc(self.arena, cap)
            if p == NULL:
                return NULL
            self.arena = p
            self.arena_capacity = cap
        return self.arena + self.arena_used

    cdef Py_ssize_t _find_block(self, uint64_t scope, uint64_t lid, int64_t hi) noexcept nogil:
        """The block holding entries (hi << 6) .. +63 of a ledger, or -1."""
        cdef mt_block *b
        cdef Py_ssize_t mask, pos
        cdef int32_t cur
        if self.last_block >= 0:
            b = &self.blocks[self.last_block]
            if b.hi == hi and b.lid == lid and b.scope == scope:
                return self.last_block
        if self.nblocks == 0:             # empty (cleared: every slot is 0): no probe, no miss
            return -1
        mask = self.nbslots - 1
        pos = _hash(scope, lid, hi) & mask
        while True:
            cur = self.bslots[pos]
            if cur == 0:
                return -1
            b = &self.blocks[cur - 1]
            if b.hi == hi and b.lid == lid and b.scope == scope:
                self.last_block = cur - 1
                return cur - 1
            pos = (pos + 1) & mask

    cdef int prepare(self, Py_ssize_t count, Py_ssize_t new_blocks) except -1:
        """Room for ``count`` more records and ``new_blocks`` more blocks (at most count:
        one per record; count // 64 + 2 for consecutive ids of one ledger), so that commit
        (called without the GIL by the add path) never has to allocate."""
        cdef Py_ssize_t need, cap, i, pos, mask, n
        cdef mt_rec *r
        cdef mt_block *nb
        cdef int32_t *s
        if count < 0 or new_blocks < 0:
            raise ValueError(f"prepare({count}, {new_blocks})")
        # blocks beyond what limit_bytes lets fits() admit are never opened
        new_blocks = min(new_blocks, count,
                         self.limit_bytes // <Py_ssize_t>sizeof(mt_block) + 1)
        if self.nrecs + count > MAX_RECS:
            raise MemoryError(f"memtable: {self.nrecs} + {count} records is over {MAX_RECS}")
        need = self.nrecs + count
        if need > self.recs_capacity:
            cap = max(self.recs_capacity * 2, 4096, need)
            r = <mt_rec *>realloc(self.recs, cap * sizeof(mt_rec))
            if r == NULL:
                raise MemoryError()
            self.recs = r
            self.recs_capacity = cap
        need = self.nblocks + new_blocks
        if need > self.blocks_capacity:
            cap = max(self.blocks_capacity * 2, 256, need)
            nb = <mt_block *>realloc(self.blocks, cap * sizeof(mt_block))
            if nb == NULL:
                raise MemoryError()
            self.blocks = nb
            self.blocks_capacity = cap
        if need * 2 > self.nbslots:
            n = max(self.nbslots * 2, 1024)
            while need * 2 > n:
                n *= 2
            s = <int32_t *>malloc(n * sizeof(int32_t))
            if s == NULL:
                raise MemoryError()
            memset(s, 0, n * sizeof(int32_t))
            free(self.bslots)
            self.bslots = s
            self.nbslots = n
            mask = n - 1
            for i in range(self.nblocks):
                pos = _hash(self.blocks[i].scope, self.blocks[i].lid, self.blocks[i].hi) & mask
                while s[pos]:
                    pos = (pos + 1) & mask
                s[pos] = <int32_t>(i + 1)
        return 0

    cdef Py_ssize_t _make_block(self, uint64_t scope, uint64_t lid, int64_t hi) noexcept nogil:
        """A new block, or -1 when prepare made no room for it."""
        cdef Py_ssize_t i = self.nblocks, pos, mask = self.nbslots - 1
        if i >= self.blocks_capacity or 2 * (i + 1) > self.nbslots:
            return -1
        self.blocks[i].scope = scope
        self.blocks[i].lid = lid
        self.blocks[i].hi = hi
        memset(self.blocks[i].slot, 0, sizeof(self.blocks[i].slot))
        pos = _hash(scope, lid, hi) & mask
        while self.bslots[pos]:
            pos = (pos + 1) & mask
        el_publish()                      # the block before the hash slot naming it
        self.bslots[pos] = <int32_t>(i + 1)
        self.nblocks += 1
        self.last_block = i
        return i

    cdef int commit(self, uint64_t scope, uint64_t lid, int64_t eid, uint8_t *data,
                    Py_ssize_t n) noexcept nogil:
        """Index n bytes already written at ``data`` == reserve(n), after prepare made room;
        a re-add of a key wins. -1 (nothing changed) when prepare made too little room or
        ``data`` is not the arena's next n bytes."""
        cdef mt_rec *r
        cdef int64_t hi = eid >> 6
        cdef Py_ssize_t blk
        cdef uint64_t where = self.next_where
        self.next_where = 0       # this commit's alone: a refused one must not pass it on
        if (self.nrecs >= self.recs_capacity or n < 0 or n > MAX_ENTRY_BYTES
                or data != self.arena + self.arena_used
                or self.arena_used + n > self.arena_capacity):
            return -1
        blk = self._find_block(scope, lid, hi)
        if blk < 0:
            blk = self._make_block(scope, lid, hi)
            if blk < 0:
                return -1
        r = &self.recs[self.nrecs]
        r.scope = scope
        r.lid = lid
        r.eid = eid
        r.offset = <uint64_t>(data - self.arena)
        r.size = <uint32_t>n
        r.where = where
        # a journal seq + 1 (a location has the top bit): how far a flush waits for the
        # journal, known without walking the records
        if r.where > self.max_pending and not (r.where >> 63):
            self.max_pending = r.where
        self.arena_used += n
        self.nrecs += 1
        if self.blocks[blk].slot[eid & 63] == 0:
            self.live += 1
        el_publish()                      # the record and its bytes before the slot
        self.blocks[blk].slot[eid & 63] = <int32_t>self.nrecs
        return 0

    cdef int put(self, uint64_t scope, uint64_t lid, int64_t eid, const uint8_t *data,
                 Py_ssize_t n) except -2:
        """Copy an encoded entry in; -1 when full (flush, then retry). ``next_where`` is
        this put's alone, taken or refused with it."""
        cdef uint8_t *dst
        cdef uint64_t where = self.next_where
        self.next_where = 0
        if n > self.limit_bytes:
            raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")
        if self.nrecs and not self.fits(n, 1 if self.opens_block(scope, lid, eid) else 0):
            return -1
        self.prepare(1, 1)
        dst = self.reserve(n)
        if dst == NULL:
            return -1
        memcpy(dst, data, n)
        self.next_where = where
        if self.commit(scope, lid, eid, dst, n) < 0:
            raise MemoryError("memtable: no room reserved for an entry")
        return 0

    cdef bint holds_range(self, uint64_t scope, uint64_t lid, int64_t lo, int64_t hi) noexcept nogil:
        """False when no entry lo..hi of the ledger can be here (a scan then reads the
        index alone instead of probing the memtable for every entry)."""
        cdef Py_ssize_t b
        cdef int64_t h
        cdef const mt_block *blk
        if self.nblocks == 0 or hi < lo:
            return False
        if (hi >> 6) - (lo >> 6) < self.nblocks:
            for h in range(lo >> 6, (hi >> 6) + 1):
                if self._find_block(scope, lid, h) >= 0:
                    return True
            return False
        for b in range(self.nblocks):
            blk = &self.blocks[b]
            if blk.scope == scope and blk.lid == lid and lo >> 6 <= blk.hi <= hi >> 6:
                return True
        return False

    cdef const uint8_t *get(self, uint64_t scope, uint64_t lid, int64_t eid,
                            Py_ssize_t *n) noexcept nogil:
        cdef Py_ssize_t blk = self._find_block(scope, lid, eid >> 6)
        cdef int32_t cur
        if blk < 0:
            return NULL
        cur = self.blocks[blk].slot[eid & 63]
        if cur == 0:
            return NULL
        n[0] = self.recs[cur - 1].size
        return self.arena + self.recs[cur - 1].offset

    # -- Python-facing ------------------------------------------------------

    def add_encoded(self, entry):
        """Copy one encoded entry (ids read from its header); False if full."""
        cdef const uint8_t[::1] v = entry
        cdef uint64_t s, l
        cdef int64_t e
        parse_ids(&v[0], v.shape[0], &s, &l, &e)
        return self.put(s, l, e, &v[0], v.shape[0]) == 0

    def get_encoded(self, uint64_t scope, uint64_t lid, int64_t eid):
        """The encoded entry, or None if the memtable does not hold it."""
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.get(scope, lid, eid, &n)
        if p == NULL:
            return None
        return PyBytes_FromStringAndSize(<const char *>p, n)

    def read_payload(self, uint64_t scope, uint64_t lid, int64_t eid, int digest, mac_key):
        """The checked payload, or None if the memtable does not hold the entry."""
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.get(scope, lid, eid, &n)
        if p == NULL:
            return None
        return decode_payload(p, n, scope, lid, eid, digest, mac_key)

    def contains(self, uint64_t scope, uint64_t lid, int64_t eid):
        cdef Py_ssize_t n
        return self.get(scope, lid, eid, &n) != NULL

    @property
    def size_bytes(self):
        return self.arena_used

    @property
    def used_bytes(self):
        """What counts against limit_bytes: the arena bytes in use and the blocks' bytes."""
        return self.arena_used + self.nblocks * <Py_ssize_t>sizeof(mt_block)

    @property
    def nblocks_used(self):
        return self.nblocks

    @property
    def count(self):
        return self.live

    @property
    def allocated_bytes(self):
        return (self.arena_capacity + self.recs_capacity * sizeof(mt_rec)
                + self.blocks_capacity * sizeof(mt_block) + self.nbslots * 4)

    def is_empty(self):
        return self.nrecs == 0

    def clear(self):
        """Forget every entry; the arena is kept for reuse."""
        self.arena_used = 0
        self.nrecs = 0
        self.live = 0
        self.max_pending = 0
        self.next_where = 0
        self.nblocks = 0
        self.last_block = -1
        if self.bslots != NULL:
            memset(self.bslots, 0, self.nbslots * sizeof(int32_t))

    def drop_ledger(self, uint64_t scope, uint64_t lid, int64_t lo=0, int64_t hi=0x7FFFFFFFFFFFFFFF):
        """Hide a ledger's entries with lo <= id <= hi (default: all) from reads and flushes."""
        cdef Py_ssize_t b, k
        cdef int32_t cur
        cdef int64_t eid
        cdef mt_block *blk
        for b in range(self.nblocks):
            blk = &self.blocks[b]
            if blk.scope != scope or blk.lid != lid:
                continue
            for k in range(64):
                cur = blk.slot[k]
                eid = (blk.hi << 6) + k
                if cur and lo <= eid <= hi:
                    self.recs[cur - 1].size = 0xFFFFFFFF      # tombstone: skipped by flush
                    blk.slot[k] = 0
                    self.live -= 1

    def last_entry_id(self, uint64_t scope, uint64_t lid):
        """The highest entry id of a ledger held (not hidden) here, -1 if none."""
        cdef Py_ssize_t b, k
        cdef int64_t best = -1
        cdef mt_block *blk
        for b in range(self.nblocks):
            blk = &self.blocks[b]
            if blk.scope != scope or blk.lid != lid:
                continue
            for k in range(64):
                if blk.slot[k] and (blk.hi << 6) + k > best:
                    best = (blk.hi << 6) + k
        return best

    cdef Py_ssize_t flush_order(self, int32_t *out, Py_ssize_t cap) except -1:
        """Fill ``out`` (room for ``cap`` >= ``live`` items) with the indexes of the live
        records sorted by (scope, ledger, entry): the blocks are sorted, then walked slot by
        slot, so a re-added entry's newest record is the one taken. Returns how many."""
        cdef blk_key *keys = <blk_key *>malloc(max(self.nblocks, 1) * sizeof(blk_key))
        cdef Py_ssize_t b, k, n = 0
        cdef int32_t cur
        if keys == NULL:
            raise MemoryError()
        with nogil:
            for b in range(self.nblocks):
                keys[b].scope = self.blocks[b].scope
                keys[b].lid = self.blocks[b].lid
                keys[b].hi = self.blocks[b].hi
                keys[b].index = b
            qsort(keys, self.nblocks, sizeof(blk_key), _cmp_blocks)
            for b in range(self.nblocks):
                for k in range(64):
                    cur = self.blocks[keys[b].index].slot[k]
                    if cur and n < cap:
                        out[n] = cur - 1
                        n += 1
        free(keys)
        if n != self.live:
            raise MemoryError(f"memtable: {n} live records walked, {self.live} counted")
        return n

    def sorted_records(self):
        """(scope, ledger, entry, arena offset, size) of the live records in flush order, as
        a numpy structured array (tests and tools; the flush itself uses flush_order)."""
        order_a = np.empty(max(self.live, 1), dtype=np.int32)
        cdef int32_t[::1] order = order_a
        cdef Py_ssize_t i, k = self.flush_order(&order[0], order.shape[0])
        dt = np.dtype([("scope", "<u8"), ("lid", "<u8"), ("eid", "<i8"), ("offset", "<u8"),
                       ("size", "<u4"), ("where", "<u8")], align=True)
        out = np.empty(k, dtype=dt)
        cdef mt_rec *dst = <mt_rec *>cnp.PyArray_DATA(out)
        for i in range(k):
            dst[i] = self.recs[order[i]]
        return out

    def flush_wheres(self, starts=None):
        """(scopes, ledgers, entry ids, wheres) of the live records in flush order, as numpy
        arrays: what a layout 2 flush turns into index locations without copying an entry.
        A ``where`` is 0 for an entry with no journal record (it goes to the entry log).

        With ``starts`` (a (n, 3) uint64 array of (journal seq, segment, offset) where each
        segment file begins, ascending: Journal.segment_starts), a where that is still a
        journal seq + 1 becomes its record's location (bit 63 | segment << 32 | offset) in
        the same pass, without the GIL (the numpy version's passes held it for tens of ms
        per 64 MiB flush, stalling every appender); None instead when an entry can have
        none (no journal record, a seq before the first start, an offset past 32 bits): the
        entry logs take that snapshot."""
        order_a = np.empty(max(self.live, 1), dtype=np.int32)
        cdef int32_t[::1] order = order_a
        cdef Py_ssize_t i, k = self.flush_order(&order[0], order.shape[0])
        scopes_a = np.empty(k, dtype=np.uint64)
        lids_a = np.empty(k, dtype=np.uint64)
        eids_a = np.empty(k, dtype=np.int64)
        wheres_a = np.empty(k, dtype=np.uint64)
        cdef uint64_t[::1] scopes = scopes_a
        cdef uint64_t[::1] lids = lids_a
        cdef int64_t[::1] eids = eids_a
        cdef uint64_t[::1] wheres = wheres_a
        cdef const uint64_t[:, ::1] st
        cdef Py_ssize_t ns = 0, j = 0, lo, hi, mid
        cdef bint locate = starts is not None, bad = False
        cdef uint64_t w, seq, off
        cdef const mt_rec *r
        if locate:
            st = np.ascontiguousarray(starts, dtype=np.uint64).reshape(-1, 3)
            ns = st.shape[0]
        with nogil:
            for i in range(k):
                r = &self.recs[order[i]]
                scopes[i] = r.scope
                lids[i] = r.lid
                eids[i] = r.eid
                w = r.where
                if locate and not (w >> 63):
                    if w == 0 or ns == 0 or w - 1 < st[0, 0]:
                        bad = True
                        break
                    seq = w - 1
                    # flush order is by ledger, so seqs mostly ascend: try the last segment
                    if not (st[j, 0] <= seq and (j + 1 == ns or seq < st[j + 1, 0])):
                        lo, hi = 0, ns - 1            # the last start at or below seq
                        while lo < hi:
                            mid = (lo + hi + 1) // 2
                            if st[mid, 0] <= seq:
                                lo = mid
                            else:
                                hi = mid - 1
                        j = lo
                    off = st[j, 2] + (seq - st[j, 0])
                    if off > <uint64_t>0xFFFFFFFF or st[j, 1] > <uint64_t>0x7FFFFFFF:
                        bad = True
                        break
                    w = (<uint64_t>1 << 63) | (st[j, 1] << 32) | off
                wheres[i] = w
        if bad:
            return None
        return scopes_a, lids_a, eids_a, wheres_a

    def arena_view(self):
        """A read-only view of the arena bytes in use (valid until the next add or clear)."""
        if self.arena_used == 0:
            return memoryview(b"")
        return memoryview(<uint8_t[:self.arena_used]>self.arena).toreadonly()

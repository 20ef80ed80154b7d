# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Ledger index files: a header with the ledger's state, then pages of entry locations.

Grammar (see docs/FORMATS.md)::

    index_file := header(1024) page*
    header     := "ELIX" version:u32(=1) state:u32 key_len:u32 master_key[64]
                  term:u64 explicit_lac:i64 incarnation:i64 zeros header_crc:u32
                  # incarnation at byte 96, crc at byte 1020, BE
    state      := bit 0 fenced | bit 1 explicit LAC set | bit 2 master key set
                | bit 3 incarnation set (the ledger's metadata ctime_ms: an add for a ledger
                  of the same id created again, after the metadata went back in time, is
                  refused; files written before it have the bit clear)
                | bit 4 length set: u64 at byte 104 is the file length the pages reach
                  when the header was written; a shorter file was cut (files written
                  before it have the bit clear and hold whole pages)
                | bit 5 LAC body set: u32 at byte 112 is its length (16..MAX_LAC_BODY),
                  the body follows at byte 116: the last WRITE_LAC body of a BookKeeper
                  client (ledger id, LAC, its digest), which READ_LAC answers with
    page       := location:u64le * 1024        # page p holds entries p*1024 .. p*1024+1023
                                                # location 0: no entry
    The last page is written only up to its highest location, so a ledger's first page
    costs what it holds (one entry: 1,032 bytes, one block, not 9,216); what a short page
    lacks reads as zeros.

Bounds: entry ids are 0 .. MAX_ENTRY_ID (format.pyx), so a page number is below 2^30 and
a page's file offset below 2^43; set_locations refuses any other id before it writes (a
negative id would index before the page's array). A location array is
ENTRIES_PER_PAGE u64s and every slot is eid % ENTRIES_PER_PAGE of a checked id.
page_locs has at most MAX_PAGE_LOCS pointers.

Pages are cached in memory up to a bound shared by every ledger of a bookie
(``IndexCache``); dirty pages and headers reach disk at a checkpoint, before
the LastLogMark moves, so a crash replays the journal over them.
"""

import errno as _errno
import os

import numpy as np
cimport numpy as cnp
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport realloc, free
from libc.string cimport memcpy, memset

from embedlog._native.format cimport el_put32, el_put64, el_get32, el_get64, el_crc32c, el_crc_init

from embedlog._native.format import MAX_ENTRY_ID
from embedlog import fileio
from embedlog._native.format import ledger_name
from embedlog.errors import CorruptedDataError, IllegalOpError

el_crc_init()
cnp.import_array()

HEADER_SIZE = 1024
ENTRIES_PER_PAGE = 1024
# the same as a C constant: in a loop, the Python name costs an int object per entry
cdef enum:
    EPP = 1024
PAGE_SIZE = 8192
MAX_KEY = 64
MAX_LAC_BODY = 64            # ledger id, LAC and a digest of them: 36 bytes with HMAC-SHA1
# pages below this number are also found through a plain array (LedgerIndex.cached_locs):
# 256M entries, at most 2 MiB of pointers for a ledger that long
cdef int64_t MAX_PAGE_LOCS = 1 << 18
STATE_FENCED = 1
STATE_EXPLICIT_LAC = 2
STATE_KEY = 4
STATE_INCARNATION = 8
STATE_LENGTH = 16
STATE_LAC_BODY = 32


def index_path(root, uint64_t scope, uint64_t lid):
    """Where a ledger's index lives under ``root`` (the ledger dir's current/).

    Scope 0: ledgers/<(lid>>8)&0xff:02x>/<lid&0xff:02x>/<lid:x>.idx (BookKeeper's fan-out).
    Scope != 0: ledgers-scoped/<(scope>>8)&0xff>/<scope&0xff>/<(lid>>8)&0xff>/<lid&0xff>/
    <qualified name>.idx. Separate roots, so the two can never collide, and no
    directory holds more than 256 entries per level (plus files at the leaves).
    """
    if scope == 0:
        return os.path.join(root, "ledgers", "%02x" % ((lid >> 8) & 0xFF), "%02x" % (lid & 0xFF),
                            "%x.idx" % lid)
    return os.path.join(root, "ledgers-scoped", "%02x" % ((scope >> 8) & 0xFF),
                        "%02x" % (scope & 0xFF), "%02x" % ((lid >> 8) & 0xFF),
                        "%02x" % (lid & 0xFF), "%016x%016x.idx" % (scope, lid))


def recorded_length(path):
    """The file length an index file's header vouches for (its pages reach that far), or
    None: the header records none (a file from before the length bit) or cannot be read
    (the loader reports and rebuilds a bad header)."""
    try:
        with open(path, "rb") as f:
            h = f.read(HEADER_SIZE)
    except OSError:
        return None
    if len(h) < HEADER_SIZE or h[:4] != b"ELIX":
        return None
    cdef const uint8_t[::1] v = h
    if el_get32(&v[1020]) != el_crc32c(0, &v[0], 1020) or not el_get32(&v[8]) & STATE_LENGTH:
        return None
    return <int64_t>el_get64(&v[104])


def parse_index_name(name, scoped):
    """(scope, ledger) from an index file name, or None."""
    if not name.endswith(".idx"):
        return None
    stem = name[:len(name) - 4]
    try:
        if scoped:
            if len(stem) != 32:
                return None
            v = int(stem, 16)
            return (v >> 64, v & 0xFFFFFFFFFFFFFFFF)
        return (0, int(stem, 16))
    except ValueError:
        return None


_IOV_MOST = 512                 # pages per pwritev (IOV_MAX is 1024 on Linux)


def _pwrite_run(int fd, list pages, int64_t offset):
    """Write index pages that lie back to back from ``offset``: one pwritev for a run,
    where a page at a time was a system call (and a GIL hand-off) for every 8 KiB."""
    cdef Py_ssize_t total = sum(v.nbytes for v in pages), done = 0, k
    while done < total:
        k = os.pwritev(fd, pages, offset + done)
        if k <= 0:
            raise OSError(_errno.EIO, f"index pages: pwritev wrote {k} of {total - done} bytes")
        done += k
        if done < total:                    # a short write: go on after what it wrote
            pages = [memoryview(b"".join(pages))[done:]]
            total, done, offset = total - done, 0, offset + done


cdef class LedgerIndex:
    """One ledger's index: state header plus cached pages of locations."""


    def __init__(self, IndexCache cache, uint64_t scope, uint64_t lid, path, root=None):
        self.cache = cache
        self.root = cache.root if root is None else root
        self.scope = scope
        self.lid = lid
        self.path = path
        self.master_key = None
        self.fenced = False
        self.term = 0
        self.incarnation = -1
        self.explicit_lac = -1
        self.lac_body = None
        self.header_dirty = False
        self.deleted = False
        self.pages = {}
        self.dirty_pages = set()
        self.max_page_on_disk = -1
        self.disk_end = HEADER_SIZE

    def __dealloc__(self):
        free(self.page_locs)

    cdef int _set_page_locs(self, int64_t page_no, object page) except -1:
        """Mirror pages[page_no] (None: gone) into page_locs, growing it as needed."""
        cdef Py_ssize_t cap
        cdef const uint64_t **locs
        if page_no < 0 or page_no >= MAX_PAGE_LOCS:
            return 0
        if page_no >= self.npage_locs:
            if page is None:
                return 0
            cap = min(max(64, page_no + 1, 2 * self.npage_locs), MAX_PAGE_LOCS)
            locs = <const uint64_t **>realloc(self.page_locs, cap * sizeof(uint64_t *))
            if locs == NULL:
                raise MemoryError()
            memset(locs + self.npage_locs, 0, (cap - self.npage_locs) * sizeof(uint64_t *))
            self.page_locs = locs
            self.npage_locs = cap
        if page is None:
            self.page_locs[page_no] = NULL
        else:
            self.page_locs[page_no] = <const uint64_t *>cnp.PyArray_DATA(page)
        return 0

    def load_header(self):
        """Read the header of an existing index file (CorruptedDataError if bad)."""
        with open(self.path, "rb") as f:
            h = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
        cdef const uint8_t[::1] v = h
        if len(h) < HEADER_SIZE:
            raise CorruptedDataError(f"index file {self.path} offset {len(h)}: the header is "
                                     f"cut short ({len(h)} of {HEADER_SIZE} bytes)")
        if h[:4] != b"ELIX":
            raise CorruptedDataError(f"index file {self.path} offset 0: bad magic {h[:4]!r}")
        if el_get32(&v[1020]) != el_crc32c(0, &v[0], 1020):
            raise CorruptedDataError(f"index file {self.path} offset 1020: header checksum mismatch")
        if el_get32(&v[4]) != 1:
            raise CorruptedDataError(f"index file {self.path} offset 4: unknown version "
                                     f"{el_get32(&v[4])}")
        state = el_get32(&v[8])
        klen = el_get32(&v[12])
        if klen > MAX_KEY:
            raise CorruptedDataError(f"index file {self.path} offset 12: master key length {klen}")
        self.master_key = bytes(h[16:16 + klen]) if state & STATE_KEY else None
        self.fenced = bool(state & STATE_FENCED)
        self.term = el_get64(&v[80])
        self.explicit_lac = <int64_t>el_get64(&v[88]) if state & STATE_EXPLICIT_LAC else -1
        self.incarnation = <int64_t>el_get64(&v[96]) if state & STATE_INCARNATION else -1
        self.lac_body = None
        if state & STATE_LAC_BODY:
            blen = el_get32(&v[112])
            if not 16 <= blen <= MAX_LAC_BODY:
                raise CorruptedDataError(f"index file {self.path} offset 112: LAC body length "
                                         f"{blen}")
            self.lac_body = bytes(h[116:116 + blen])
        self._set_disk_end(size)

    cdef _set_disk_end(self, int64_t end):
        self.disk_end = max(end, HEADER_SIZE)
        self.max_page_on_disk = (self.disk_end - 1 - HEADER_SIZE) // PAGE_SIZE

    cdef bytes _header_bytes(self):
        cdef bytearray h = bytearray(HEADER_SIZE)
        cdef uint8_t *p = h
        cdef uint32_t state = 0
        memcpy(p, b"ELIX", 4)
        el_put32(p + 4, 1)
        if self.fenced:
            state |= STATE_FENCED
        if self.explicit_lac >= 0:
            state |= STATE_EXPLICIT_LAC
        key = self.master_key
        if key is not None:
            if len(key) > MAX_KEY:
                raise IllegalOpError(f"master key longer than {MAX_KEY} bytes")
            state |= STATE_KEY
            h[16:16 + len(key)] = key
            el_put32(p + 12, len(key))
        if self.incarnation >= 0:
            state |= STATE_INCARNATION
            el_put64(p + 96, <uint64_t>self.incarnation)
        body = self.lac_body
        if body is not None:
            if not 16 <= len(body) <= MAX_LAC_BODY:
                raise IllegalOpError(f"a LAC body is 16 to {MAX_LAC_BODY} bytes, not {len(body)}")
            state |= STATE_LAC_BODY
            el_put32(p + 112, len(body))
            h[116:116 + len(body)] = body
        state |= STATE_LENGTH
        el_put64(p + 104, <uint64_t>self.disk_end)
        el_put32(p + 8, state)
        el_put64(p + 80, self.term)
        el_put64(p + 88, <uint64_t>self.explicit_lac)
        el_put32(p + 1020, el_crc32c(0, p, 1020))
        return bytes(h)

    cdef object _page(self, int64_t page_no, bint create, bint dirty=False):
        """The page, loaded or created as needed. With ``dirty`` it is marked dirty before
        the cache may evict anything, so a page about to be written is never dropped."""
        page = self.pages.get(page_no)
        if page is not None:
            if dirty:
                self.dirty_pages.add(page_no)
            return page
        if page_no <= self.max_page_on_disk:
            while True:
                loads = self.page_loads[page_no & 63]
                with open(self.path, "rb") as f:
                    f.seek(HEADER_SIZE + page_no * PAGE_SIZE)
                    raw = f.read(PAGE_SIZE)
                # the read released the GIL (readers load pages without the storage lock):
                # if another thread loaded this page meanwhile, its copy wins, and a writer
                # marks it dirty (a clean page may be evicted with the locations just set)
                existing = self.pages.get(page_no)
                if existing is not None:
                    if dirty:
                        self.dirty_pages.add(page_no)
                    return existing
                if self.page_loads[page_no & 63] == loads:
                    break
                # this page (or one sharing its counter) was loaded meanwhile, maybe then
                # changed, written back and evicted: what was read may be older
            if len(raw) != PAGE_SIZE:
                raw = raw + bytes(PAGE_SIZE - len(raw))
            page = np.frombuffer(bytearray(raw), dtype="<u8")
        elif create:
            page = np.zeros(ENTRIES_PER_PAGE, dtype="<u8")
        else:
            return None
        self.pages[page_no] = page
        self.page_loads[page_no & 63] += 1
        self._set_page_locs(page_no, page)
        if dirty:
            self.dirty_pages.add(page_no)
        self.cache._loaded(self, page_no)
        return page

    cpdef uint64_t get_location(self, int64_t eid):
        if eid < 0:
            return 0
        page = self._page(eid // EPP, False)
        if page is None:
            return 0
        cdef uint64_t[::1] v = page
        return v[eid % EPP]

    def set_locations(self, eids, locations):
        """Record locations for entry ids (numpy arrays of equal length)."""
        cdef int64_t[::1] e = np.ascontiguousarray(eids, dtype=np.int64)
        cdef uint64_t[::1] l = np.ascontiguousarray(locations, dtype=np.uint64)
        cdef Py_ssize_t i, n = e.shape[0]
        cdef int64_t page_no, cur = -1, top = MAX_ENTRY_ID
        cdef uint64_t[::1] v
        if l.shape[0] != n:
            raise IllegalOpError(f"{n} entry ids and {l.shape[0]} locations")
        for i in range(n):
            if e[i] < 0 or e[i] > top:
                raise IllegalOpError(f"entry id {e[i]} of ledger {ledger_name(self.scope, self.lid)} is "
                                     f"outside 0..{top}, what the index addresses")
        for i in range(n):
            page_no = e[i] // EPP
            if page_no != cur:
                page = self._page(page_no, True, True)
                v = page
                cur = page_no
            v[e[i] % EPP] = l[i]

    def _pages_between(self, int64_t lo_page, int64_t hi_page):
        """The page numbers in lo_page..hi_page that may hold a location, ascending: those in
        memory and those the file has data for (its holes are pages never written). Walks
        cost what the ledger holds, not its highest id: a ledger with one entry near
        MAX_ENTRY_ID spans 2^30 pages, nearly all of them holes."""
        pages = {p for p in self.pages if lo_page <= p <= hi_page}
        cdef int64_t top = min(hi_page, self.max_page_on_disk), first, last
        if top < lo_page:
            return sorted(pages)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return sorted(pages)
        try:
            off = HEADER_SIZE + lo_page * PAGE_SIZE
            end = HEADER_SIZE + (top + 1) * PAGE_SIZE
            while off < end:
                try:
                    data = os.lseek(fd, off, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == _errno.ENXIO:        # no data after off
                        break
                    pages.update(range(lo_page, top + 1))   # no SEEK_DATA here: every page
                    break
                if data >= end:
                    break
                hole = os.lseek(fd, data, os.SEEK_HOLE)
                first = max(lo_page, (data - HEADER_SIZE) // PAGE_SIZE)
                last = min(top, (hole - 1 - HEADER_SIZE) // PAGE_SIZE)
                pages.update(range(first, last + 1))
                off = hole
        finally:
            os.close(fd)
        return sorted(pages)

    def clear_range(self, int64_t lo, int64_t hi=0x7FFFFFFFFFFFFFFF):
        """Forget every entry with lo <= id <= hi (stream truncation and retention)."""
        cdef int64_t p, a, b
        lo = max(lo, 0)
        if hi < lo:
            return
        for p in self._pages_between(lo // ENTRIES_PER_PAGE, hi // ENTRIES_PER_PAGE):
            a = max(lo - p * ENTRIES_PER_PAGE, 0)
            b = min(hi - p * ENTRIES_PER_PAGE, ENTRIES_PER_PAGE - 1)
            page = self._page(p, False)
            if page is None or not page[a:b + 1].any():
                continue
            page = self._page(p, False, True)      # dirty: the cleared slots reach disk
            page[a:b + 1] = 0

    def last_entry_id(self):
        """The highest entry id with a location, or -1."""
        cdef int64_t top = max(self.max_page_on_disk, max(self.pages) if self.pages else -1)
        if (top == self.max_page_on_disk and top >= 0 and top not in self.pages
                and self.disk_end > HEADER_SIZE and (self.disk_end - HEADER_SIZE) % 8 == 0):
            # the last page ends at its highest location unless slots were cleared since:
            # read that slot, not the page (a start-up opening 100,000 ledgers loads none);
            # a length that is not whole slots is a damaged file's: read the page
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                fd = -1
            if fd >= 0:
                try:
                    raw = os.pread(fd, 8, self.disk_end - 8)
                finally:
                    os.close(fd)
                if len(raw) == 8 and raw != bytes(8):
                    return (self.disk_end - 8 - HEADER_SIZE) // 8
        for p in reversed(self._pages_between(0, top)):
            page = self._page(p, False)
            if page is None:
                continue
            nz = np.flatnonzero(page)
            if len(nz):
                return p * ENTRIES_PER_PAGE + int(nz[len(nz) - 1])
        return -1

    def entry_ids(self):
        """Every entry id with a location, ascending (for scans and checks)."""
        cdef int64_t top = max(self.max_page_on_disk, max(self.pages) if self.pages else -1)
        out = []
        for p in self._pages_between(0, top):
            page = self._page(p, False)
            if page is not None:
                out.extend((p * ENTRIES_PER_PAGE + np.flatnonzero(page)).tolist())
        return out

    def segments(self):
        """The journal segments (layout 2) this ledger's locations point into: a set of
        segment numbers, from every page in memory or on disk."""
        cdef int64_t top = max(self.max_page_on_disk, max(self.pages) if self.pages else -1)
        out = set()
        for p in self._pages_between(0, top):
            page = self._page(p, False)
            if page is not None:
                locs = page[page >= (1 << 63)]
                if len(locs):
                    out.update(np.unique((locs >> 32) & 0x7FFFFFFF).tolist())
        return out

    def match_locations(self, eids, locations):
        """A bool array: True where the index holds exactly that location for the entry id
        (the entry copy at that location is the live one)."""
        cdef int64_t[::1] e = np.ascontiguousarray(eids, dtype=np.int64)
        cdef uint64_t[::1] l = np.ascontiguousarray(locations, dtype=np.uint64)
        cdef Py_ssize_t i, n = e.shape[0]
        if l.shape[0] != n:
            raise IllegalOpError(f"{n} entry ids and {l.shape[0]} locations")
        out_a = np.zeros(n, dtype=np.bool_)
        cdef cnp.npy_bool[::1] out = out_a
        cdef int64_t page_no, cur = -1
        cdef uint64_t[::1] v
        cdef bint have = False
        for i in range(n):
            if e[i] < 0:
                continue
            page_no = e[i] // EPP
            if page_no != cur:
                page = self._page(page_no, False)
                cur = page_no
                have = page is not None
                if have:
                    v = page
            if have and v[e[i] % EPP] == l[i]:
                out[i] = True
        return out_a

    def replace_locations(self, eids, locations, source_log_ids):
        """Compaction: point each entry id at its new location, but only where the index
        still points into one of ``source_log_ids`` (an entry rewritten or erased since
        keeps what it has). Returns how many were replaced."""
        cdef int64_t[::1] e = np.ascontiguousarray(eids, dtype=np.int64)
        cdef uint64_t[::1] l = np.ascontiguousarray(locations, dtype=np.uint64)
        cdef uint64_t[::1] src = np.ascontiguousarray(source_log_ids, dtype=np.uint64)
        cdef Py_ssize_t i, j, n = e.shape[0], ns = src.shape[0], done = 0
        cdef int64_t page_no, cur = -1
        cdef uint64_t[::1] v
        cdef uint64_t old
        cdef bint have = False
        if l.shape[0] != n:
            raise IllegalOpError(f"{n} entry ids and {l.shape[0]} locations")
        for i in range(n):
            if e[i] < 0:
                continue
            page_no = e[i] // EPP
            if page_no != cur:
                # marked dirty as it is loaded, so the cache cannot evict it under us
                page = self._page(page_no, False, True)
                cur = page_no
                have = page is not None
                if have:
                    v = page
            if not have:
                continue
            old = v[e[i] % EPP]
            if old == 0:
                continue
            for j in range(ns):
                if (old >> 32) == src[j]:
                    v[e[i] % EPP] = l[i]
                    done += 1
                    break
        return done

    def flush(self, bint sync=True):
        """Write dirty pages and the header; fdatasync when asked. Returns the bytes written
        (0: nothing was dirty). A page is written from its start each time it is dirty, so a
        page filled over several checkpoints counts each time."""
        if self.deleted or (not self.dirty_pages and not self.header_dirty):
            return 0
        new = not os.path.exists(self.path)
        if new:
            _private_dirs(os.path.dirname(self.path))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            end = self.disk_end
            written = HEADER_SIZE
            run, run_off, run_end = [], 0, 0      # adjacent pages go in one pwritev
            for p in sorted(self.dirty_pages):
                off = HEADER_SIZE + p * PAGE_SIZE
                page = self.pages[p]
                n = PAGE_SIZE
                if off + PAGE_SIZE > end:
                    # the last page: up to its highest location, and at least what the file
                    # holds of it (slots cleared since must be overwritten with zeros)
                    nz = np.flatnonzero(page)
                    n = max(8 * (int(nz[len(nz) - 1]) + 1) if len(nz) else 0, end - off)
                    n = min(PAGE_SIZE, (n + 7) // 8 * 8)     # whole slots (a damaged file's
                                                              # length may be any number)
                if n > 0:
                    if run and (off != run_end or len(run) >= _IOV_MOST):
                        _pwrite_run(fd, run, run_off)
                        run = []
                    if not run:
                        run_off = off
                    run.append(page[:n // 8])
                    run_end = off + n
                    written += n
                    end = max(end, off + n)
            if run:
                _pwrite_run(fd, run, run_off)
            self._set_disk_end(end)
            # the header last: the length it records covers pages already written
            os.pwrite(fd, self._header_bytes(), 0)
            if sync:
                # a new file's size and name must survive too: fsync, and its directories
                fileio.sync(fd, self.path, os.fstat(fd).st_size, data_only=not new,
                            dirs_up_to=self.root if new else None)
        finally:
            os.close(fd)
        if new and not sync:
            fileio.fsync_dirs(os.path.dirname(self.path), self.root)
        self.dirty_pages.clear()
        self.header_dirty = False
        self.cache.bytes_written += written
        return written

    def flush_header(self):
        """Write the header alone and sync it: what it holds is durable before a checkpoint
        (a WRITE_LAC's body is answered once it is). The pages stay for the checkpoint, and
        the length the header records is the one their last flush reached. Callers hold
        the storage's lock, as a checkpoint's flush does."""
        if self.deleted:
            return False
        new = not os.path.exists(self.path)
        if new:
            _private_dirs(os.path.dirname(self.path))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, self._header_bytes(), 0)
            fileio.sync(fd, self.path, os.fstat(fd).st_size, data_only=not new,
                        dirs_up_to=self.root if new else None)
        finally:
            os.close(fd)
        self.cache.bytes_written += HEADER_SIZE
        return True

    def delete(self):
        """Forget the ledger: cached pages and the file (a later flush writes nothing)."""
        self.deleted = True
        self.drop_pages()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        # durable: an index file that came back after a crash would point into entry logs
        # that garbage collection has deleted since
        fileio.fsync_dir(os.path.dirname(self.path))

    def drop_pages(self):
        """Forget cached pages (after delete)."""
        for p in list(self.pages):
            self.cache._unloaded(self, p)
        self.pages.clear()
        if self.page_locs != NULL:
            memset(self.page_locs, 0, self.npage_locs * sizeof(uint64_t *))
        self.dirty_pages.clear()

    cdef bint _evict(self, int64_t page_no):
        if page_no in self.dirty_pages:
            return False
        if self.pages.pop(page_no, None) is not None:
            self._set_page_locs(page_no, None)
            return True
        return False


cdef class IndexCache:
    """Bounds the pages held in memory across every ledger of a bookie."""


    def __init__(self, root, Py_ssize_t page_limit=8192, choose_root=None):
        """``root``: the current/ directory of the (first) ledger directory; ``choose_root``:
        () -> the current/ directory a new ledger's index goes to (several ledger dirs)."""
        self.choose_root = choose_root
        import collections
        self.root = root
        self.page_limit = max(page_limit, 16)
        self.loaded = 0
        self.order = collections.deque()
        self.evictions = 0
        self.bytes_written = 0

    cdef _loaded(self, LedgerIndex idx, int64_t page_no):
        self.loaded += 1
        self.order.append((idx, page_no))
        if self.loaded > self.page_limit:
            self._evict_some()

    cdef _unloaded(self, LedgerIndex idx, int64_t page_no):
        self.loaded -= 1

    cdef _evict_some(self):
        # FIFO with second chance for dirty pages: they stay until a checkpoint
        cdef Py_ssize_t tries = len(self.order)
        cdef LedgerIndex idx
        while self.loaded > self.page_limit and tries > 0:
            tries -= 1
            item = self.order.popleft()
            idx = item[0]
            page_no = item[1]
            if page_no not in idx.pages:
                continue
            if idx._evict(page_no):
                self.loaded -= 1
                self.evictions += 1
            else:
                self.order.append(item)

    def open(self, uint64_t scope, uint64_t lid, bint exists, root=None):
        if root is None:
            root = self.choose_root() if self.choose_root is not None else self.root
        idx = LedgerIndex(self, scope, lid, index_path(root, scope, lid), root)
        if exists:
            idx.load_header()
        return idx

    def trim(self):
        self._evict_some()


def _private_dirs(path):
    """Create ``path`` and its missing parents 0700 (os.makedirs gives parents the default)."""
    if os.path.isdir(path):
        return
    _private_dirs(os.path.dirname(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


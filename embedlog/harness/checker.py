"""A seeded protocol checker: random schedules of writers, readers, recoveries and
take-overs against a LocalCluster under per-message faults, metadata gates and process
faults, then the protocol's invariants.

A schedule is a list of steps made from the seed alone (``make_schedule``), so a seed names
the same schedule every time; what the cluster does with it may still vary with timing,
which is the point of running many. ``tools/protocol_check.py`` runs seeds for a while and
prints the schedule of any seed that breaks an invariant; ``--seed N`` replays it.

Every LONG_EVERY-th seed is a long one: its ledgers are striped (E > Qw, so each bookie
gets entry ids with gaps) and some of its appends are bulk ones of thousands of entries
(a 3/2/2 ledger of 100,000 entries once crashed every bookie). The other seeds'
schedules are the same as before long ones existed.

Invariants checked after every schedule, once every fault is healed (Vanlightly's TLA+
properties, BOOKKEEPER.md section 6):

- every acknowledged entry is readable with its bytes (AllAckedEntriesAreReadable);
- a closed ledger's last entry covers every acknowledgement, and its length is the sum of
  its entries' payloads (NoDivergenceBetweenClientAndMetaData);
- entry ids follow the writer's order: entry e holds the e-th payload sent (no foreign or
  reordered bytes), so no two readers can see different bytes for one position;
- nothing a reader read up to its LAC is missing from the closed ledger (NoDirtyReads);
- a stream keeps every acknowledged position with its bytes; a writer whose term was taken
  over is never acknowledged at or after the position the take-over started from;
- fragments start at strictly increasing entries, each with E distinct bookies, and none
  starts past a closed ledger's last entry + 1;
- a ledger created under the id of one recovered and deleted before ("reuse": the id
  given explicitly once its deletion record is purged) holds only its own entries, while
  the bookies may still hold the old one's (the entry-order invariant above).
"""
from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from dataclasses import dataclass, field

from embedlog.bookie.descriptors import FACTS_RECHECK_S
from embedlog.errors import EmbedlogError

CLIENTS = 3
KINDS = ("append", "append_async", "close", "recover", "read", "create", "rule", "release",
         "gate", "bookie", "take_over", "stream_append", "stream_read", "join", "delete")
# and "reuse": a deleted ledger's id given to a new ledger (after half the deletes)
WEIGHTS = (22, 10, 5, 7, 7, 3, 14, 6, 6, 6, 4, 7, 2, 5, 2)
BOOKIE_CONFIG = {"gc_wait_time_ms": 500}     # deleted ledgers leave the bookies during a run
ENSEMBLES = ((3, 3, 2), (3, 2, 2), (3, 3, 3), (4, 3, 2), (2, 2, 1))
LONG_EVERY = 4                               # seeds 0, 4, 8...: striped ensembles, bulk appends
STRIPED = ((3, 2, 2), (4, 2, 2), (4, 3, 2), (5, 3, 2), (5, 2, 2))
BULK = (2_000, 5_000, 20_000)                # entries in one bulk append (append_many of 1000s)
GATE_KINDS = ("recovery", "ensemble_change", "close", "term", "term_commit")


@dataclass
class Step:
    kind: str
    args: dict

    def __str__(self):
        return f"{self.kind}(" + ", ".join(f"{k}={v!r}" for k, v in self.args.items()) + ")"


def make_schedule(seed: int, steps: int = 40, bookies: int = 5, long_every: int = LONG_EVERY) -> list:
    """The steps seed ``seed`` names (the same list every time). Appends go mostly to a
    ledger no earlier step closed, recovered or deleted, and stream appends mostly to the
    client that took the stream over last, so most schedules keep writing under faults.
    If ``long_every`` divides the seed, ledgers are striped and a quarter of the appends
    are bulk ones (``long_every=0``: none is)."""
    rnd = random.Random(seed)
    # a deleted ledger's id is used again (a "reuse" step after half the deletes) from a
    # stream of its own, so the other steps of a seed stay what they were
    reuse_rnd = random.Random(seed * 7919 + 17)
    long = bool(long_every) and seed % long_every == 0
    striped = [e for e in STRIPED if e[0] <= bookies]
    out: list = []
    ledgers: list = []
    live: list = []                       # ledgers whose writer no step has stopped yet
    planned: dict = {}
    streams = ["S0"]
    leader: dict = {}                     # stream -> client that took it over last
    rules = gates = 0
    down: dict = {}

    def create():
        name = f"L{len(ledgers)}"
        ledgers.append(name)
        live.append(name)
        planned[name] = 0
        out.append(Step("create", dict(ledger=name, client=rnd.randrange(CLIENTS),
                                       ensemble=rnd.choice(striped if long else ENSEMBLES))))
        return name

    create()
    while len(out) < steps:
        kind = rnd.choices(KINDS, WEIGHTS)[0]
        any_lg = rnd.choice(ledgers)
        bg = rnd.random() < 0.5
        if kind in ("append", "append_async"):
            lg = rnd.choice(live) if live and rnd.random() < 0.9 else (create() if not live else any_lg)
            n = rnd.randint(1, 20 if kind == "append" else 40)
            if long and rnd.random() < 0.25:
                n = rnd.choice(BULK)
                out.append(Step("bulk", dict(ledger=lg, n=n)))
            else:
                out.append(Step(kind, dict(ledger=lg, n=n, many=rnd.random() < 0.4)))
            planned[lg] += n
        elif kind in ("close", "recover", "delete"):
            lg = any_lg
            args = dict(ledger=lg, background=bg)
            if kind != "close":
                args["client"] = rnd.randrange(CLIENTS)
            out.append(Step(kind, args))
            if lg in live:
                live.remove(lg)
            if kind == "delete" and reuse_rnd.random() < 0.5:
                name = f"L{len(ledgers)}"
                ledgers.append(name)
                live.append(name)
                planned[name] = 0
                out.append(Step("reuse", dict(ledger=name, of=lg, client=reuse_rnd.randrange(CLIENTS),
                                              ensemble=reuse_rnd.choice(striped if long else ENSEMBLES))))
        elif kind == "read":
            out.append(Step("read", dict(ledger=any_lg, client=rnd.randrange(CLIENTS))))
        elif kind == "create":
            create()
        elif kind == "rule":
            action = rnd.choice(("drop", "delay", "hold", "fail", "fail"))
            op = rnd.choice(("add", "add", "add", "read", "read_lac", "write_lac", None))
            args = dict(rule=rules, action=action, bookie=rnd.randrange(bookies), op=op,
                        direction=rnd.choice(("request", "response")),
                        count=rnd.choice((1, 2, 5, None)))
            if rnd.random() < 0.5:
                lg = rnd.choice(live) if live else any_lg
                args["ledger"] = lg
                if op in ("add", "read") and rnd.random() < 0.6:
                    first = max(0, planned[lg] + rnd.randint(-5, 10))
                    args["entries"] = (first, first + rnd.randint(0, 5))
            if rnd.random() < 0.3:
                args["client"] = rnd.randrange(CLIENTS)
            if action == "delay":
                args["seconds"] = rnd.choice((0.05, 0.3, 1.0))
            if action == "fail":
                args["error"] = rnd.choice(("EIO", "EIO", "ETOOMANYREQUESTS", "EREADONLY"))
            rules += 1
            out.append(Step("rule", args))
        elif kind == "release":
            if rules or gates:
                out.append(Step("release", dict(rule=rnd.randrange(rules + gates))))
        elif kind == "gate":
            out.append(Step("gate", dict(gate=rules + gates, kind=rnd.choice(GATE_KINDS),
                                         action=rnd.choice(("pause", "pause", "fail", "fail_after",
                                                            "delay")))))
            gates += 1
        elif kind == "bookie":
            i = rnd.randrange(bookies)
            if i in down:
                out.append(Step("bookie", dict(bookie=i, action="resume" if down.pop(i) == "suspend"
                                               else "restart")))
            elif len(down) < 2:
                how = rnd.choice(("kill", "suspend", "stop"))
                down[i] = how
                out.append(Step("bookie", dict(bookie=i, action=how)))
        elif kind == "take_over":
            if rnd.random() < 0.2:
                streams.append(f"S{len(streams)}")
            st, c = rnd.choice(streams), rnd.randrange(CLIENTS)
            leader[st] = c
            out.append(Step("take_over", dict(stream=st, client=c, background=bg)))
        elif kind == "stream_append":
            st = rnd.choice(streams)
            c = leader.get(st, 0) if rnd.random() < 0.8 else rnd.randrange(CLIENTS)
            out.append(Step("stream_append", dict(stream=st, client=c, n=rnd.randint(1, 15))))
        elif kind == "stream_read":
            out.append(Step("stream_read", dict(stream=rnd.choice(streams), client=rnd.randrange(CLIENTS))))
        else:
            out.append(Step("join", {}))
    return out


def payload(name: str, k: int) -> bytes:
    return f"{name}/{k}/".encode() * (1 + k % 5)


@dataclass
class LedgerState_:
    name: str
    client: int
    handle: object = None
    lid: object = None
    ensemble: tuple = ()
    sent: int = 0                                    # payloads handed to the writer
    acked: dict = field(default_factory=dict)        # entry id -> payload
    observed: dict = field(default_factory=dict)     # entry id -> bytes a reader saw
    deleted_at: int | None = None                    # recovered end, once recovered and deleted
    deleted_mono: float = 0.0                        # when (time.monotonic())
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class StreamState:
    name: str
    leaders: dict = field(default_factory=dict)      # client -> (Stream, term, taken-at position)
    acked: dict = field(default_factory=dict)        # position -> (payload, term)
    sent: int = 0
    takeovers: list = field(default_factory=list)    # (term, first position of that term)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Report:
    seed: int
    schedule: list
    violations: list
    counts: dict
    seconds: float

    def __str__(self):
        c = self.counts
        head = (f"seed {self.seed}: {len(self.schedule)} steps, {c.get('acks', 0)} acks, "
                f"{c.get('faults', 0)} faults, {self.seconds:.1f} s (steps {c.get('steps_s')}, "
                f"heal {c.get('heal_s')}, join {c.get('join_s')}, check {c.get('check_s')})")
        if not self.violations:
            return head + ": ok"
        lines = [head + f": {len(self.violations)} VIOLATION(S)"]
        lines += [f"  ! {v}" for v in self.violations]
        lines.append("  schedule (replay with --seed %d):" % self.seed)
        lines += [f"    {k:3d} {s}" for k, s in enumerate(self.schedule)]
        return "\n".join(lines)


class Run:
    """One schedule against one cluster; ``run()`` returns a Report."""

    OP_TIMEOUT_S = 120.0
    STEP_WAIT_S = 3.0      # a foreground step still running after this goes on in the background
    JOIN_WAIT_S = 5.0      # a join step waits this long for background steps (held ones stay held)

    def __init__(self, cluster, seed: int, schedule: list, *, client_timeout_s: float = 2.0):
        self.cluster = cluster
        self.seed = seed
        self.schedule = schedule
        self.clients = [cluster.client(f"c{k}", add_timeout_s=client_timeout_s,
                                       read_timeout_s=client_timeout_s) for k in range(CLIENTS)]
        self.ledgers: dict = {}
        self.streams: dict = {}
        self.faults: dict = {}                       # schedule index -> Rule or Gate
        self.background: list = []
        self.violations: list = []
        self.counts = {"acks": 0, "faults": 0, "errors": 0, "recoveries": 0, "take_overs": 0}
        self.down: dict = {}
        self.run_id = f"{seed}-{time.monotonic_ns() % 10 ** 9}"

    # -- driving ------------------------------------------------------------------------------

    def run(self) -> Report:
        t0 = time.monotonic()
        try:
            for step in self.schedule:
                getattr(self, "_" + step.kind)(**step.args)
        except Exception as exc:      # the checker itself must not hide a failure
            self.violations.append(f"checker step failed: {type(exc).__name__}: {exc}")
        finally:
            t1 = time.monotonic()
            self._heal()
            t2 = time.monotonic()
            self._join(final=True)
            t3 = time.monotonic()
            self._check()
            self.counts.update(steps_s=round(t1 - t0, 1), heal_s=round(t2 - t1, 1),
                               join_s=round(t3 - t2, 1), check_s=round(time.monotonic() - t3, 1))
            for c in self.clients:
                c.close()
        return Report(self.seed, self.schedule, self.violations, self.counts, time.monotonic() - t0)

    def _spawn(self, fn, *args, wait_s: float = 0.0) -> None:
        """Run an operation in a thread of its own; wait for it up to ``wait_s`` (a step the
        schedule calls foreground may be held by a fault the schedule releases later)."""
        t = threading.Thread(target=self._guard, args=(fn,) + args, daemon=True)
        t.start()
        t.join(wait_s)
        if t.is_alive():
            self.background.append(t)

    def _fg(self, fn, *args) -> None:
        self._spawn(fn, *args, wait_s=self.STEP_WAIT_S)

    def _run_step(self, background: bool, fn, *args) -> None:
        (self._spawn if background else self._fg)(fn, *args)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except EmbedlogError:
            self.counts["errors"] += 1
        except Exception as exc:
            self.violations.append(f"{fn.__name__}{args}: unexpected {type(exc).__name__}: {exc}")

    def _join(self, final: bool = False) -> None:
        deadline = time.monotonic() + (self.OP_TIMEOUT_S if final else self.JOIN_WAIT_S)
        for t in self.background:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.background if t.is_alive()]
        if final and stuck:
            self.violations.append(f"{len(stuck)} operation(s) still running {self.OP_TIMEOUT_S:.0f} s "
                                   "after every fault was healed; the clients' tasks:\n"
                                   + "\n".join(_tasks(c) for c in self.clients))
        self.background = stuck

    # -- ledgers --------------------------------------------------------------------------------

    def _create(self, ledger, client, ensemble):
        st = LedgerState_(ledger, client)
        self.ledgers[ledger] = st
        self._fg(self._do_create, st, client, ensemble)

    def _do_create(self, st, client, ensemble):
        with st.lock:
            st.handle = self.clients[client].create_ledger(*ensemble)
            st.lid = st.handle.ledger_id

    def _writable(self, ledger):
        st = self.ledgers.get(ledger)
        return st if st is not None and st.handle is not None else None

    def _append(self, ledger, n, many):
        st = self._writable(ledger)
        if st is not None:
            self._fg(self._do_append, st, n, many)

    def _append_async(self, ledger, n, many):
        st = self._writable(ledger)
        if st is not None:
            self._spawn(self._do_append, st, n, many)

    def _bulk(self, ledger, n):
        st = self._writable(ledger)
        if st is not None:
            self._fg(self._do_append, st, n, True)

    def _do_append(self, st, n, many):
        """Hand in n payloads: one append_async each, or with ``many`` append_many_async
        calls of up to 1000 (one call's entries take consecutive ids)."""
        with st.lock:                    # entry ids follow the order payloads are handed over
            futures = []
            while len(futures) < n:
                k = st.sent
                m = min(n - len(futures), 1000) if many else 1
                try:
                    fs = st.handle.append_many_async([payload(st.name, k + i) for i in range(m)])
                except EmbedlogError:
                    break
                futures.extend(zip(range(k, k + m), fs))
                st.sent += m
        for k, f in futures:
            try:
                eid = f.result(self.OP_TIMEOUT_S)
            except EmbedlogError:
                self.counts["errors"] += 1
                continue
            if eid != k:
                self.violations.append(f"{st.name}: payload {k} was acknowledged as entry {eid}")
            st.acked[eid] = payload(st.name, k)
            self.counts["acks"] += 1

    def _close(self, ledger, background):
        st = self._writable(ledger)
        if st is not None:
            self._run_step(background, st.handle.close)

    def _recover(self, ledger, client, background):
        st = self.ledgers.get(ledger)
        if st is not None and st.lid is not None:
            self._run_step(background, self._do_recover, st, client)

    def _do_recover(self, st, client):
        r = self.clients[client].open_ledger(st.lid)
        self.counts["recoveries"] += 1
        self._observe(st, r, r.last_add_confirmed)

    def _delete(self, ledger, client, background):
        st = self.ledgers.get(ledger)
        if st is not None and st.lid is not None and st.deleted_at is None:
            self._run_step(background, self._do_delete, st, client)

    def _do_delete(self, st, client):
        """Recover, then delete: the writer, if it goes on, must never be acknowledged past
        the recovered end (bookies remember deleted ledgers and refuse them)."""
        r = self.clients[client].open_ledger(st.lid)
        self._observe(st, r, r.last_add_confirmed)
        self.clients[client].delete_ledger(st.lid)
        st.deleted_mono = time.monotonic()
        st.deleted_at = r.last_add_confirmed

    def _reuse(self, ledger, of, client, ensemble):
        """A new ledger under the id of ``of`` once that one is recovered and deleted: its
        deletion record purged (its retention passed) and the id given explicitly. The
        bookies that held ``of`` must never serve its entries as the new ledger's."""
        old = self.ledgers.get(of)
        if old is None or old.lid is None:
            return
        deadline = time.monotonic() + self.STEP_WAIT_S
        while old.deleted_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if old.deleted_at is None:
            return
        # a bookie on a store without watches (SQLite, etcd) trusts what it read of a ledger
        # for up to FACTS_RECHECK_S on plain reads; no id comes back that soon there (its
        # deletion record is kept for deleted_ledger_retention_ms), so neither does it here
        time.sleep(max(0.0, old.deleted_mono + FACTS_RECHECK_S - time.monotonic()))
        st = LedgerState_(ledger, client)
        self.ledgers[ledger] = st
        lid, old.lid = old.lid, None     # later steps naming the old one find no ledger; its
        self._fg(self._do_reuse, st, lid, client, ensemble)   # writer goes on, a zombie

    def _do_reuse(self, st, lid, client, ensemble):
        c = self.clients[client]
        c.metadata.ledger_manager.purge_deletions(int(time.time() * 1000) + 1)
        with st.lock:
            st.handle = c.create_ledger(*ensemble, ledger_id=lid)
            st.lid = st.handle.ledger_id
        self.counts["reused_ids"] = self.counts.get("reused_ids", 0) + 1

    def _read(self, ledger, client):
        st = self.ledgers.get(ledger)
        if st is not None and st.lid is not None:
            self._fg(self._do_read, st, client)

    def _do_read(self, st, client):
        r = self.clients[client].open_ledger(st.lid, recovery=False)
        self._observe(st, r, r.last_add_confirmed)

    def _observe(self, st, r, lac):
        first = max(0, lac - 30)
        if lac < 0:
            return
        for e, data in zip(range(first, lac + 1), r.read_batch(first, lac)):
            prev = st.observed.setdefault(e, data)
            if prev != data:
                self.violations.append(f"{st.name}: two readers saw different bytes at entry {e}")

    # -- faults ----------------------------------------------------------------------------------

    def _rule(self, rule, action, bookie, op, direction, count, ledger=None, entries=None,
              client=None, seconds=None, error=None):
        match = dict(bookie=bookie, op=op, direction=direction, count=count, entries=entries)
        if ledger is not None:
            st = self.ledgers.get(ledger)
            if st is None or st.lid is None:
                return
            match["ledger"] = st.lid
        if client is not None:
            match["client"] = f"c{client}"
        f = self.cluster.faults
        if action == "delay":
            r = f.delay(seconds, **match)
        elif action == "fail":
            r = f.fail(error, **match)
        else:
            r = f.rule(action, **match)
        self.faults[rule] = r
        self.counts["faults"] += 1

    def _gate(self, gate, kind, action):
        self.faults[gate] = self.cluster.faults.gate(kind, action=action, delay_s=0.5)
        self.counts["faults"] += 1

    def _release(self, rule):
        item = self.faults.get(rule)
        if item is not None:
            item.release()

    def _bookie(self, bookie, action):
        c = self.cluster
        if action == "kill":
            c.kill_bookie(bookie)
        elif action == "stop":
            c.stop_bookie(bookie)
        elif action == "suspend":
            c.suspend_bookie(bookie)
        elif action == "resume":
            c.resume_bookie(bookie)
        else:
            c.restart_bookie(bookie)
        self.down[bookie] = action
        if action in ("resume", "restart"):
            self.down.pop(bookie)
        self.counts["faults"] += 1

    def _heal(self) -> None:
        self.cluster.faults.clear()
        for i, how in list(self.down.items()):
            if how == "suspend":
                self.cluster.resume_bookie(i)
            else:
                self.cluster.restart_bookie(i)
        self.down.clear()

    # -- streams ---------------------------------------------------------------------------------

    def _stream(self, name) -> StreamState:
        # streams outlive a run on a shared cluster: each run has its own names
        return self.streams.setdefault(name, StreamState(f"{name}.{self.run_id}"))

    def _take_over(self, stream, client, background):
        self._run_step(background, self._do_take_over, self._stream(stream), client)

    def _do_take_over(self, ss, client):
        s = self.clients[client].open_stream(ss.name)
        start = s.take_over()
        term = s.term
        self.counts["take_overs"] += 1
        with ss.lock:
            ss.leaders[client] = (s, term)
            ss.takeovers.append((term, start))

    def _stream_append(self, stream, client, n):
        ss = self._stream(stream)
        lead = ss.leaders.get(client)
        if lead is not None:
            self._fg(self._do_stream_append, ss, lead, n)

    def _do_stream_append(self, ss, lead, n):
        s, term = lead
        for _ in range(n):
            with ss.lock:
                k = ss.sent
                ss.sent += 1
            data = payload(ss.name, k)
            pos = s.append(data)
            with ss.lock:
                if pos in ss.acked:
                    self.violations.append(f"stream {ss.name}: position {pos} acknowledged twice "
                                           f"(terms {ss.acked[pos][1]} and {term})")
                ss.acked[pos] = (data, term)
            self.counts["acks"] += 1

    def _stream_read(self, stream, client):
        ss = self._stream(stream)
        self._fg(self._do_stream_read, ss, client)

    def _do_stream_read(self, ss, client):
        s = self.clients[client].open_stream(ss.name, create=False)
        for e in s.read(0):
            if not e.data.startswith(ss.name.encode() + b"/"):
                self.violations.append(f"stream {ss.name}: foreign bytes at position {e.position}")

    # -- invariants --------------------------------------------------------------------------------

    def _check(self) -> None:
        checker = self.cluster.client("checker", add_timeout_s=10, read_timeout_s=10)
        try:
            for st in self.ledgers.values():
                if st.deleted_at is not None:
                    late = [e for e in st.acked if e > st.deleted_at]
                    if late:
                        self.violations.append(f"{st.name}: entries {late[:5]} acknowledged past "
                                               f"{st.deleted_at}, where it was recovered and deleted")
                elif st.lid is not None:
                    self._check_ledger(checker, st)
            for ss in self.streams.values():
                self._check_stream(checker, ss)
        finally:
            checker.close()

    def _retry(self, fn, what):
        last = None
        for _ in range(5):
            try:
                return fn()
            except EmbedlogError as exc:
                last = exc
                time.sleep(1.0)
        self.violations.append(f"{what}: {type(last).__name__}: {last} (after every fault healed)")
        return None

    def _check_ledger(self, checker, st) -> None:
        r = self._retry(lambda: checker.open_ledger(st.lid), f"{st.name}: recovery")
        if r is None:
            return
        md = r.metadata
        last = md.last_entry_id
        if st.acked and last < max(st.acked):
            self.violations.append(f"{st.name}: closed at {last} below acknowledged entry {max(st.acked)}")
        entries = self._retry(lambda: r.read_batch(0, last) if last >= 0 else [], f"{st.name}: read")
        if entries is None:
            return
        for e, data in enumerate(entries):
            if data != payload(st.name, e):
                self.violations.append(f"{st.name}: entry {e} holds foreign bytes {data[:40]!r}")
        for e, data in st.acked.items():
            if e <= last and entries[e] != data:
                self.violations.append(f"{st.name}: acknowledged entry {e} reads other bytes")
        for e, data in st.observed.items():
            if e > last:
                self.violations.append(f"{st.name}: a reader saw entry {e}, past the closed end {last}")
            elif entries[e] != data:
                self.violations.append(f"{st.name}: a reader saw other bytes at entry {e}")
        if md.length != sum(len(d) for d in entries):
            self.violations.append(f"{st.name}: length {md.length} != {sum(len(d) for d in entries)}")
        self._check_fragments(st.name, md, last)

    def _check_fragments(self, name, md, last) -> None:
        firsts = [f for f, _ in md.fragments]
        if firsts != sorted(set(firsts)) or (firsts and firsts[0] != md.first_entry_id):
            self.violations.append(f"{name}: fragment starts not strictly increasing: {firsts}")
        for f, ens in md.fragments:
            if len(ens) != md.ensemble_size or len(set(ens)) != len(ens):
                self.violations.append(f"{name}: fragment at {f} has ensemble {ens}")
        if md.is_closed and firsts and firsts[-1] > last + 1:
            self.violations.append(f"{name}: fragment at {firsts[-1]} past the last entry {last}")

    def _check_stream(self, checker, ss) -> None:
        if not ss.acked and not ss.takeovers:
            return
        s = checker.open_stream(ss.name)
        if self._retry(s.take_over, f"stream {ss.name}: final take-over") is None:
            return
        got = self._retry(lambda: {e.position: e.data for e in s.read(0)}, f"stream {ss.name}: read")
        if got is None:
            return
        for pos, (data, term) in ss.acked.items():
            if got.get(pos) != data:
                self.violations.append(f"stream {ss.name}: acknowledged position {pos} (term {term}) "
                                       f"reads {got.get(pos, b'nothing')[:40]!r}")
            for t2, start in ss.takeovers:
                if t2 > term and pos >= start - 1:
                    self.violations.append(f"stream {ss.name}: term {term} acknowledged position {pos} "
                                           f"at or after term {t2}'s no-op ({start - 1})")
        seen: dict = {}
        for pos, data in sorted(got.items()):
            if not data.startswith(ss.name.encode() + b"/"):
                self.violations.append(f"stream {ss.name}: foreign bytes at {pos}: {data[:40]!r}")
            elif data in seen:
                self.violations.append(f"stream {ss.name}: position {pos} repeats position "
                                       f"{seen[data]} ({data[:24]!r})")
            seen.setdefault(data, pos)
        self._check_fragments(f"stream {ss.name}", s.metadata, None)


def _tasks(client) -> str:
    """What a client's event loop is doing (to explain an operation that never ends)."""

    async def dump():
        out = io.StringIO()
        for t in asyncio.all_tasks():
            if t is not asyncio.current_task():
                t.print_stack(limit=8, file=out)
        return out.getvalue()
    try:
        return f"-- {client.context.name}:\n" + client.context.run(dump(), timeout=10)
    except Exception as exc:
        return f"-- {client.context.name}: cannot dump tasks ({exc!r})"


def run_seed(cluster, seed: int, steps: int = 40) -> Report:
    return Run(cluster, seed, make_schedule(seed, steps, len(cluster))).run()

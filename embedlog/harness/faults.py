"""Faults on demand, per message and per metadata write: ``LocalCluster.faults``.

A race in a replication protocol is found by making it happen on purpose, not by luck.
The clients a LocalCluster makes (``cluster.client(name=...)``) send every message to a
bookie, and make every ledger metadata write, through this object::

    f = cluster.faults
    f.drop(bookie=2, op="add", entries=(7, 9), direction="response")  # b2 stores 7..9, nobody hears
    f.delay(0.5, bookie=1, op="read")                 # reads to bookie 1 arrive 0.5 s late
    r = f.hold(bookie=0, op="add", direction="response")
    r.wait_hits(1); ...; r.release()                  # held answers go on from here
    f.fail("EIO", bookie=1, op="add", count=1)        # an error answer; the bookie did nothing
    g = f.gate("ensemble_change")                     # the next such metadata write pauses
    g.wait_reached(); ...; g.release()                # or g.release(fail=True)

Message rules match on ``bookie`` (its index in the cluster, or its id), ``client`` (the
name given to ``cluster.client``), ``op`` ("add", "read", "read_lac", "write_lac", "trim"),
``ledger`` (LedgerId or int), ``entries`` ((first, last), inclusive: a frame matches when
one of its entries is in the range; set max_entries_per_frame=1 on the client to aim at
single entries) and ``recovery`` (True: fencing, recovery and recovery-add messages only;
False: only the others). ``direction`` is "request" (the bookie never sees the message, or
sees it late) or "response" (the bookie did the work; the client hears nothing, hears it
late, or hears an error). The first rule that matches a message in a direction applies;
``count`` retires a rule after that many messages. Holds, drops and delays count against
the client's own timeout, as a slow network would: past it the call fails with
TimeoutError.

Metadata gates match on the kind of write (embedlog.client.context.METADATA_WRITES:
"recovery", "ensemble_change", "close", "term", "term_commit", "truncate", "rereplicate",
"release"),
``ledger`` and ``client``; their action is "pause" (until ``release``), "fail" (the write
is not made; the client gets MetadataError), "fail_after" (the write is made, and the
client still gets MetadataError: the ambiguous outcome of a lost connection) or "delay".
"""
from __future__ import annotations

import asyncio
import threading
import time

from embedlog._native.format import LedgerId, parse_entry_header
from embedlog.errors import IllegalOpError, MetadataError, TimeoutError, from_wire_code
from embedlog.client.context import METADATA_WRITES
from embedlog.net import protocol as P

OPS = {"add": P.ADD, "read": P.READ, "read_lac": P.READ_LAC, "write_lac": P.WRITE_LAC, "trim": P.TRIM}
ACTIONS = ("drop", "delay", "hold", "fail")
GATE_ACTIONS = ("pause", "fail", "fail_after", "delay")
_RECOVERY_FLAGS = P.FLAG_FENCE | P.FLAG_RECOVERY_ADD | P.FLAG_RECOVERY_READ
PAUSE_LIMIT_S = 300.0            # a gate nobody releases lets its write go after this


class _Waitable:
    """Hit counting and release, shared by rules and gates (any thread, any event loop)."""

    def __init__(self, count):
        if count is not None and count < 1:
            raise IllegalOpError(f"count is a positive number of messages, got {count!r}")
        self.count = count
        self.hits = 0                     # messages (writes) matched
        self.passed = 0                   # of those, the ones that then went on
        self.removed = False
        self._cv = threading.Condition()
        self._released = False
        self._fail_on_release = False
        self._waiters: list = []          # (loop, future) of held async callers

    def _claim(self) -> bool:
        with self._cv:
            if self.removed or (self.count is not None and self.hits >= self.count):
                return False
            self.hits += 1
            self._cv.notify_all()
            return True

    def wait_hits(self, n: int = 1, timeout: float = 30.0) -> bool:
        """Wait until ``n`` messages (or writes) matched; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self.hits >= n, timeout)

    def wait_passed(self, n: int = 1, timeout: float = 30.0) -> bool:
        """Wait until ``n`` matched messages went on (a held answer reached the client)."""
        with self._cv:
            return self._cv.wait_for(lambda: self.passed >= n, timeout)

    def _pass(self) -> None:
        with self._cv:
            self.passed += 1
            self._cv.notify_all()

    def release(self, fail: bool = False) -> None:
        """Let what is held go on (a gate's paused write fails instead with ``fail``);
        later matches pass at once."""
        with self._cv:
            self._released = True
            self._fail_on_release = fail
            waiters, self._waiters = self._waiters, []
            self._cv.notify_all()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_finish, fut)

    def remove(self) -> None:
        """Stop matching; what is held is released."""
        self.removed = True
        self.release()

    async def _held(self, deadline: float) -> bool:
        """Wait for release until ``deadline`` (loop time); False if it came first."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._cv:
            if self._released:
                return True
            self._waiters.append((loop, fut))
        try:
            await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
            return True
        except asyncio.TimeoutError:
            return False


def _finish(fut) -> None:
    if not fut.done():
        fut.set_result(None)


class Rule(_Waitable):
    def __init__(self, faults, action, *, bookie=None, client=None, op=None, ledger=None,
                 entries=None, recovery=None, direction="request", count=None, delay_s=0.0,
                 error="EIO"):
        super().__init__(count)
        if action not in ACTIONS:
            raise IllegalOpError(f"action is one of {ACTIONS}, got {action!r}")
        if direction not in ("request", "response"):
            raise IllegalOpError(f"direction is 'request' or 'response', got {direction!r}")
        if op is not None and op not in OPS:
            raise IllegalOpError(f"op is one of {sorted(OPS)}, got {op!r}")
        if entries is not None and (len(entries) != 2 or entries[0] > entries[1]):
            raise IllegalOpError(f"entries is (first, last) with first <= last, got {entries!r}")
        self._faults = faults
        self.action, self.direction = action, direction
        self.bookie, self.client, self.op = bookie, client, op
        self.ledger = None if ledger is None else LedgerId.coerce(ledger)
        self.entries, self.recovery = entries, recovery
        self.delay_s = float(delay_s)
        self.status = error if isinstance(error, int) else getattr(P, str(error), None)
        if self.status is None:
            raise IllegalOpError(f"error is a wire status name (EIO, EFENCED, ...) or code, got {error!r}")

    def __repr__(self):
        what = {k: v for k, v in dict(bookie=self.bookie, client=self.client, op=self.op,
                                      ledger=self.ledger, entries=self.entries,
                                      recovery=self.recovery).items() if v is not None}
        return f"Rule({self.action} {self.direction} {what}, hits={self.hits})"

    def matches(self, client: str, bookie_id: str, msg) -> bool:
        if self.removed or (self.client is not None and self.client != client):
            return False
        if self.bookie is not None and self._faults.bookie_id(self.bookie) != bookie_id:
            return False
        if self.op is not None and OPS[self.op] != msg.op:
            return False
        if self.ledger is not None and (self.ledger.scope_id, self.ledger.ledger_id) != (msg.scope, msg.ledger):
            return False
        if self.recovery is not None and bool(msg.flags & _RECOVERY_FLAGS) != self.recovery:
            return False
        if self.entries is not None:
            if msg.entries is None or not (msg.entries[0] <= self.entries[1] and self.entries[0] <= msg.entries[1]):
                return False
        return True

    async def apply(self, deadline: float, what: str) -> None:
        """Do this rule's action to a message; raises what the client then sees."""
        loop = asyncio.get_running_loop()
        if self.action == "fail":
            raise from_wire_code(self.status, f"injected {what} fault (status {self.status})")
        if self.action == "delay":
            await asyncio.sleep(max(0.0, min(self.delay_s, deadline - loop.time())))
        elif self.action == "hold":
            await self._held(deadline)
        else:   # drop: nothing arrives; the client waits out its timeout
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        if loop.time() >= deadline:
            raise TimeoutError(f"no answer in time ({what} {self.action} by a fault rule)")


class Gate(_Waitable):
    def __init__(self, kind, *, action="pause", ledger=None, client=None, count=1, delay_s=0.0):
        super().__init__(count)
        if kind not in METADATA_WRITES:
            raise IllegalOpError(f"kind is one of {METADATA_WRITES}, got {kind!r}")
        if action not in GATE_ACTIONS:
            raise IllegalOpError(f"action is one of {GATE_ACTIONS}, got {action!r}")
        self.kind, self.action = kind, action
        self.ledger = None if ledger is None else LedgerId.coerce(ledger)
        self.client, self.delay_s = client, float(delay_s)

    def __repr__(self):
        return f"Gate({self.action} {self.kind} ledger={self.ledger} client={self.client}, hits={self.hits})"

    def matches(self, client: str, kind: str, md) -> bool:
        return (not self.removed and kind == self.kind
                and (self.client is None or self.client == client)
                and (self.ledger is None or self.ledger == md.ledger_id))

    def wait_reached(self, timeout: float = 30.0) -> bool:
        """Wait until a write reached this gate (a paused one waits there for release)."""
        return self.wait_hits(1, timeout)

    def pass_through(self, write, md, version):
        if self.action == "fail":
            raise MetadataError(f"injected metadata fault: the {self.kind} write was not made")
        if self.action == "delay":
            time.sleep(self.delay_s)
        elif self.action == "pause":
            with self._cv:
                self._cv.wait_for(lambda: self._released, PAUSE_LIMIT_S)
                fail = self._fail_on_release
            if fail:
                raise MetadataError(f"injected metadata fault: the paused {self.kind} write failed")
        v = write(md, version)
        self._pass()
        if self.action == "fail_after":
            raise MetadataError(f"injected metadata fault: the {self.kind} write was made, "
                                "and its answer lost")
        return v


class _Message:
    """What a fault rule sees of a request frame."""
    __slots__ = ("op", "flags", "scope", "ledger", "entries")

    def __init__(self, frame: bytes):
        req = P.parse_request(memoryview(frame)[4:])
        self.op, self.flags, self.scope, self.ledger = req.op, req.flags, req.scope, req.ledger
        self.entries = None
        if req.op == P.ADD:
            ids = [parse_entry_header(e)[3] for e in P.parse_add_body(req.body)]
            self.entries = (min(ids), max(ids)) if ids else None
        elif req.op == P.READ:
            first, count, _lac, _t = P.parse_read_request(req.body)
            self.entries = (first, first + count - 1)


class Faults:
    """The fault rules and metadata gates of one LocalCluster (or of any clients given it)."""

    def __init__(self, cluster=None):
        self._cluster = cluster
        self._rules: list[Rule] = []
        self._gates: list[Gate] = []
        self._lock = threading.Lock()
        self.log: list = []              # (monotonic time, what happened): a failing test prints it

    def bookie_id(self, bookie) -> str:
        if isinstance(bookie, int) and self._cluster is not None:
            return self._cluster.bookie_id(bookie)
        return bookie

    # -- message rules -------------------------------------------------------------------

    def rule(self, action: str, **match) -> Rule:
        r = Rule(self, action, **match)
        with self._lock:
            self._rules.append(r)
        return r

    def drop(self, **match) -> Rule:
        return self.rule("drop", **match)

    def delay(self, seconds: float, **match) -> Rule:
        return self.rule("delay", delay_s=seconds, **match)

    def hold(self, **match) -> Rule:
        return self.rule("hold", **match)

    def fail(self, error="EIO", **match) -> Rule:
        return self.rule("fail", error=error, **match)

    # -- metadata gates ------------------------------------------------------------------

    def gate(self, kind: str, action: str = "pause", **match) -> Gate:
        g = Gate(kind, action=action, **match)
        with self._lock:
            self._gates.append(g)
        return g

    def clear(self) -> None:
        """Remove every rule and gate (releasing what they hold)."""
        with self._lock:
            items, self._rules, self._gates = self._rules + self._gates, [], []
        for item in items:
            item.remove()

    # -- the seams the client calls (embedlog.client.context) ------------------------------

    def _first(self, items, claim_args) -> object | None:
        with self._lock:
            candidates = list(items)
        for item in candidates:
            if item.matches(*claim_args) and item._claim():
                return item
        return None

    def quiet(self) -> bool:
        """No rule is set: a message sent now meets none (the client may skip this hook)."""
        return not self._rules

    async def message(self, ctx, bookie_id: str, build, timeout_s: float, call):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        msg = None                    # parsed only when a rule may look at it
        rules = [r for r in self._rules if r.direction == "request"]
        if rules:
            msg = _Message(build(0))
        rule = self._first(rules, (ctx.name, bookie_id, msg)) if rules else None
        if rule is not None:
            self._note(ctx, rule, bookie_id, msg)
            await rule.apply(deadline, "request")
            rule._pass()
        try:
            result = await call(bookie_id, build, max(0.001, deadline - loop.time()))
            error = None
        except Exception as exc:      # an error answer is a response too
            result, error = None, exc
        rules = [r for r in self._rules if r.direction == "response"]
        if rules and msg is None:
            msg = _Message(build(0))
        rule = self._first(rules, (ctx.name, bookie_id, msg)) if rules else None
        if rule is not None:
            self._note(ctx, rule, bookie_id, msg)
            await rule.apply(deadline, "response")
            # the caller goes on with the answer in this same step of the loop: count it
            # as passed once it has (a test waiting on passed then sees its effect)
            asyncio.get_running_loop().call_soon(rule._pass)
        if error is not None:
            raise error
        return result

    def metadata_write(self, ctx, kind: str, md, version, write):
        gate = self._first(self._gates, (ctx.name, kind, md))
        if gate is None:
            return write(md, version)
        self.log.append((time.monotonic(), f"{ctx.name or 'client'}: {kind} of {md.ledger_id} at {gate!r}"))
        return gate.pass_through(write, md, version)

    def _note(self, ctx, rule, bookie_id, msg) -> None:
        self.log.append((time.monotonic(), f"{ctx.name or 'client'} -> {bookie_id}: {rule!r} "
                                           f"op={msg.op} entries={msg.entries}"))

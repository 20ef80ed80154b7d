"""The client's add path kernels (embedlog._native.addpath) and the ADD frame
(embedlog._native.frames.add_request) against the Python they replaced: the same frames and
entries, the same acknowledgement rules, futures completed in order."""
from __future__ import annotations

import collections
import os
import random
import struct
import threading

import pytest

from support.cliutil import wait_until
from embedlog._native import addpath, frames
from embedlog._native.addpath import AddFuture, PendingAdd
from embedlog._native.format import decode_entry, encode_entry, mac_key, parse_entry_header
from embedlog.client.schedule import stripe
from embedlog.errors import EmbedlogError, IllegalOpError
from embedlog.net import protocol as P

KEY = bytes(range(20))


def packed(payloads: list) -> tuple:
    """A produce queue's packed take of ``payloads``: (data, native int64 end offsets)."""
    ends, end = [], 0
    for p in payloads:
        end += len(p)
        ends.append(end)
    return b"".join(payloads), struct.pack(f"={len(ends)}q", *ends)


def python_add_request(request_id, scope, ledger, master_key, entries, flags=0, term=0) -> bytes:
    """The frame as protocol's structs spell it (REQ_HEAD, the count, then size + entry)."""
    parts = [P.REQ_HEAD.pack(P.VERSION, P.ADD, flags, request_id, scope, ledger, master_key, term),
             P.U32.pack(len(entries))]
    for e in entries:
        parts += [P.U32.pack(len(e)), bytes(e)]
    body = b"".join(parts)
    return P.LENGTH.pack(len(body)) + body


@pytest.mark.parametrize("seed", range(5))
def test_an_add_frame_is_byte_for_byte_the_structs_frame(seed):
    rng = random.Random(seed)
    entries = []
    for _ in range(rng.randrange(0, 50)):
        data = rng.randbytes(rng.choice([0, 1, 100, 1024, 70_000]))
        entries.append(rng.choice([bytes, bytearray, memoryview])(data))
    args = (rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64), rng.randbytes(20),
            entries, rng.getrandbits(16), rng.getrandbits(64))
    frame = frames.add_request(*args)
    assert frame == python_add_request(*args)
    # and the bookie's parser takes it back apart
    req = P.parse_request(frame[4:])
    if entries:
        assert [bytes(e) for e in P.parse_add_body(req.body)] == [bytes(e) for e in entries]


def test_an_add_frame_refuses_what_does_not_fit_its_fields():
    with pytest.raises(IllegalOpError, match="master key of 19 bytes"):
        frames.add_request(1, 0, 1, KEY[:19], [b"x"])
    with pytest.raises(IllegalOpError, match="16 bits"):
        frames.add_request(1, 0, 1, KEY, [b"x"], flags=1 << 16)
    with pytest.raises(OverflowError):
        frames.add_request(-1, 0, 1, KEY, [b"x"])


@pytest.mark.parametrize("scope,digest", [(0, 3), (7, 3), (0, 1), (5, 2), (0, 4)])
def test_a_batch_encodes_as_entry_by_entry_with_consecutive_ids_and_lengths(scope, digest):
    mk = mac_key(b"pw") if digest == 2 else None
    rng = random.Random(digest)
    datas = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(300)]
    batch = [(d if i % 3 else memoryview(d), AddFuture()) for i, d in enumerate(datas)]
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    eid, length, failed = addpath.encode_adds(batch, scope, 42, 10, 9, 1000, digest, mk, pending, ops)
    assert (eid, failed) == (310, 0)
    assert length == 1000 + sum(map(len, datas))
    assert list(pending) == list(range(10, 310)) and [op.entry_id for op in ops] == list(range(10, 310))
    running = 1000
    for op, data, (_d, fut) in zip(ops, datas, batch):
        running += len(data)
        assert op.length == running and op.future is fut and op.acked is None
        assert op.count == 1 and op.last_id == op.entry_id
        entry = op.data[4:]          # sized as the ADD frame carries it
        assert op.data[:4] == P.U32.pack(len(entry))
        assert entry == encode_entry(scope, 42, op.entry_id, 9, running, digest, data, mk)
        assert decode_entry(entry, scope, 42, op.entry_id, digest, mk) == data
        assert parse_entry_header(entry)[4:6] == (9, running)


def test_an_entry_that_cannot_be_encoded_fails_alone_and_takes_no_id():
    batch = [(b"a", AddFuture()), (b"b", AddFuture())]
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    # an unknown digest code: each entry fails with the encoder's own error
    eid, length, failed = addpath.encode_adds(batch, 0, 1, 0, -1, 0, 9, None, pending, ops)
    assert (eid, length, failed, ops, dict(pending)) == (0, 0, 2, [], {})
    for _data, fut in batch:
        assert isinstance(fut.exception(), EmbedlogError)


def acks(op) -> set:
    """The bookies that acknowledged ``op``: PendingAdd.acked is None, one bookie (the
    first acknowledgement makes no set) or a set."""
    return set() if op.acked is None else {op.acked} if isinstance(op.acked, str) else set(op.acked)


def python_ack(ops, bookie, pending, quorums):
    for op in ops:
        if pending.get(op.entry_id) is op and bookie in quorums[op.entry_id % len(quorums)]:
            op.acked = (op.acked or set()) | {bookie}


def python_run(pending, qa, quorums):
    done = []
    for eid, op in pending.items():
        ws = quorums[eid % len(quorums)]
        acked = op.acked or set()
        if len(acked) < qa or (not acked.issubset(ws) and sum(b in ws for b in acked) < qa):
            break
        done.append(op)
    return done


@pytest.mark.parametrize("ens,qw,qa", [(1, 1, 1), (3, 3, 2), (3, 2, 2), (5, 3, 2)])
def test_acknowledgements_and_the_acknowledged_run_follow_the_write_sets(ens, qw, qa):
    """Random answers (some from a bookie outside the write set, some for an op replaced
    since) counted by the kernel and by the Python rule, over striped ensembles."""
    rng = random.Random(ens * 10 + qw)
    bookies = [f"b{i}" for i in range(ens)]
    quorums = [stripe(bookies, qw, s) for s in range(ens)]
    twins = []
    for pend in (collections.OrderedDict(), collections.OrderedDict()):
        ops = [PendingAdd(e, b"", e, AddFuture()) for e in range(200)]
        for op in ops:
            pend[op.entry_id] = op
        twins.append((pend, ops))
    (kp, kops), (pp, pops) = twins
    stale = PendingAdd(5, b"", 5, AddFuture())      # an op no longer pending under its id
    for _ in range(400):
        b = rng.choice(bookies + ["elsewhere"])
        lo = rng.randrange(0, 200)
        hi = min(200, lo + rng.randrange(1, 40))
        addpath.ack(kops[lo:hi] + [stale], b, kp, quorums)
        python_ack(pops[lo:hi] + [stale], b, pp, quorums)
        assert [acks(op) for op in kops] == [acks(op) for op in pops] and not stale.acked
        got = [op.entry_id for op in addpath.acknowledged_run(kp, qa, quorums)]
        want = [op.entry_id for op in python_run(pp, qa, quorums)]
        for _op in want:
            pp.popitem(last=False)
        assert got == want and list(kp) == list(pp)


@pytest.mark.parametrize("ens,qw", [(1, 1), (3, 3), (3, 2), (5, 3), (5, 1)])
def test_ops_go_to_their_write_sets_and_into_frames_as_the_python_rule_says(ens, qw):
    """by_bookie against the loop it replaced (some ops acknowledged by a bookie already,
    with and without ``only``), and frame_cuts against the cut by count and bytes, entries
    over the byte limit included."""
    rng = random.Random(ens * 10 + qw)
    bookies = [f"b{i}" for i in range(ens)]
    quorums = [stripe(bookies, qw, s) for s in range(ens)]
    ops = [PendingAdd(e, b"x" * rng.choice([0, 10, 100, 1200]), e, AddFuture())
           for e in range(rng.randrange(300, 400), 700)]
    for op in rng.sample(ops, 80):
        op.acked = set(rng.sample(bookies, rng.randrange(1, ens + 1)))
    for only in (None, set(rng.sample(bookies, max(1, ens - 1))), {"elsewhere"}):
        want: dict = {}
        for op in ops:
            for b in quorums[op.entry_id % ens]:
                if (only is None or b in only) and (op.acked is None or b not in op.acked):
                    want.setdefault(b, []).append(op)
        got = addpath.by_bookie(ops, quorums, only)
        assert {b: [op.entry_id for op in v] for b, v in got.items()} == \
            {b: [op.entry_id for op in v] for b, v in want.items()}
    assert addpath.by_bookie(ops, [], None) == {}
    # frame_cuts counts entries, not ops: some ops are runs of ids
    for op in rng.sample(ops, 60):
        op.last_id = op.entry_id + rng.randrange(1, 9)
    for limit, most in ((1000, 7), (4000, 1000), (10, 3), (1 << 20, 1)):
        want_cuts, start, size, entries = [], 0, 0, 0
        for i, op in enumerate(ops):
            size += len(op.data)
            entries += op.last_id - op.entry_id + 1
            if (size > limit or entries > most) and i > start:
                want_cuts.append(i)
                start, size, entries = i, len(op.data), op.last_id - op.entry_id + 1
        assert addpath.frame_cuts(ops, limit, most) == want_cuts + [len(ops)]
    assert addpath.frame_cuts([], 10, 3) == [0]


def test_write_sets_of_any_id_and_ops_of_another_type_are_safe():
    """The kernels index the write quorums without bounds checks: an id below zero takes
    Python's modulo (C's would index before the list), and an op that is not a PendingAdd
    is a TypeError, not a bad read."""
    bookies = ["b0", "b1", "b2"]
    quorums = [stripe(bookies, 2, s) for s in range(3)]
    ops = [PendingAdd(e, b"x", 0, AddFuture()) for e in (-7, -1, 2**63 - 1, -2**63)]
    got = addpath.by_bookie(ops, quorums, None)
    for b, v in got.items():
        assert all(b in quorums[op.entry_id % 3] for op in v)
    assert sum(len(v) for v in got.values()) == 2 * len(ops)
    pending = collections.OrderedDict((op.entry_id, op) for op in ops)
    addpath.ack(ops, "b0", pending, quorums)
    assert [acks(op) for op in ops] == [{"b0"} if "b0" in quorums[op.entry_id % 3] else set()
                                        for op in ops]
    for bad in ([object()], [b"x"]):
        with pytest.raises(TypeError):
            addpath.by_bookie(bad, quorums, None)
        with pytest.raises(TypeError):
            addpath.frame_cuts(bad, 10, 3)


def test_a_run_completes_in_order_with_waiters_and_callbacks_among_it():
    ops = [PendingAdd(e, b"", e, AddFuture()) for e in range(1000)]
    calls = []
    for op in ops[::7]:
        op.future.add_done_callback(lambda f: calls.append(f.result()))
    seen = {}

    def waiter(k):
        seen[k] = ops[k].future.result(timeout=30)

    threads = [threading.Thread(target=waiter, args=(k,)) for k in (0, 3, 500, 999)]
    for t in threads:
        t.start()
    for k in (0, 3, 500, 999):       # each has its condition made, so it goes the slow way
        while ops[k].future._made is None:
            threading.Event().wait(0.001)
    addpath.set_results(ops)
    for t in threads:
        t.join(30)
    assert seen == {0: 0, 3: 3, 500: 500, 999: 999}
    assert [op.future.result() for op in ops] == list(range(1000))
    assert calls == list(range(0, 1000, 7))


def test_a_large_window_of_real_adds_round_trips(tmp_path):
    """The whole path on a served ledger: 20,000 adds of random sizes on a 3/2/2 ensemble
    (striped: every bookie sees gapped ids), then read back."""
    from embedlog import Client
    from embedlog.harness import LocalCluster
    datas = [os.urandom(random.Random(i).randrange(0, 2000)) for i in range(20_000)]
    with LocalCluster(bookies=3, base_dir=str(tmp_path), proxies=False) as lc, \
            Client(lc.metadata_uri, **lc.client_config) as c:
        w = c.create_ledger(3, 2, 2)
        futs = [w.append_async(d) for d in datas]
        assert [f.result(timeout=120) for f in futs] == list(range(20_000))
        w.close()
        r = c.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == 19_999
        assert [e.data for e in r.read(0, 19_999)] == datas


def test_adds_skip_the_task_until_a_fault_rule_is_set_and_a_killed_bookie_loses_nothing(tmp_path):
    """ADD frames go out without a task (ClientContext.send) on open connections while no fault
    rule is set, and through the fault hook (call) once one is; a bookie SIGKILLed under a
    full window of adds on that path is replaced and no acknowledged add is lost."""
    from embedlog.harness import LocalCluster
    with LocalCluster(bookies=4, base_dir=str(tmp_path), proxies=False) as lc:
        c = lc.client()
        ctx = c._ctx
        sent = {"fast": 0, "hook": 0}
        send, call = ctx.send, ctx.call

        def counting_send(*args):
            ok = send(*args)
            sent["fast"] += ok
            return ok

        async def counting_call(*args):
            sent["hook"] += 1
            return await call(*args)
        ctx.send, ctx.call = counting_send, counting_call
        w = c.create_ledger(3, 3, 2)
        w.append(b"opens the connections")
        sent.update(fast=0, hook=0)
        futs = [w.append_async(b"%d" % i) for i in range(2000)]
        victim = lc.index_of(w.metadata.fragments[0][1][0])
        lc.kill_bookie(victim)
        futs += [w.append_async(b"%d" % i) for i in range(2000, 4000)]
        assert [f.result(timeout=60) for f in futs] == list(range(1, 4001))
        assert sent["fast"] > 0
        # with Qa=2 the adds go on beside the ensemble change: it lands on its own time
        wait_until(lambda: len(c.ledger_metadata(w.ledger_id).fragments) >= 2, what="ensemble change")
        md = c.ledger_metadata(w.ledger_id)
        assert lc.bookie_id(victim) not in md.fragments[-1][1]

        rule = lc.faults.delay(0.001)              # any rule: every frame meets the hook
        before = dict(sent)
        w.append(b"through the hook")
        assert sent["hook"] > before["hook"] and sent["fast"] == before["fast"]
        rule.remove()
        w.close()
        r = c.open_ledger(w.ledger_id)
        assert [e.data for e in r.read(1, 4000)] == [b"%d" % i for i in range(4000)]


def test_produced_adds_make_no_object_the_collector_tracks():
    """encode_produced (issue 48): one future for the batch, on its last add; the others
    carry none and are not tracked by the collector, and a first acknowledgement is the
    bookie itself, not a set; acked_by and forget_acks read and drop either form."""
    import gc
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    last = AddFuture()
    eid, length = addpath.encode_produced(packed([b"a", b"bb", b"ccc"]), last, 0, 7, 10, 9, 100,
                                          3, None, pending, ops)
    assert (eid, length) == (13, 106) and [op.entry_id for op in ops] == [10, 11, 12]
    assert [op.future for op in ops] == [None, None, last]
    assert [gc.is_tracked(op) for op in ops] == [False, False, True]
    quorums = [["b0", "b1"]]
    addpath.ack(ops, "b0", pending, quorums)
    assert [op.acked for op in ops] == ["b0"] * 3
    addpath.ack(ops[:1], "b1", pending, quorums)
    assert ops[0].acked == {"b0", "b1"} and addpath.acked_by(ops[0], "b1")
    assert addpath.acked_by(ops[1], "b0") and not addpath.acked_by(ops[1], "b")   # not a substring test
    addpath.forget_acks(ops[1], {"b0"})
    addpath.forget_acks(ops[0], {"b0"})
    assert ops[1].acked is None and ops[0].acked == {"b1"}
    assert [op.entry_id for op in addpath.acknowledged_run(pending, 1, quorums)] == [10]
    done = [ops[2]]
    addpath.set_results([ops[1]] + done)
    assert last.result(0) == 12
    with pytest.raises(TypeError):
        addpath.encode_produced([b"x"], last, 0, 7, 0, -1, 0, 3, None, pending, [])
    with pytest.raises(TypeError):
        addpath.encode_produced((bytearray(b"x"), struct.pack("=q", 1)), last, 0, 7, 0, -1, 0, 3,
                                None, pending, [])


@pytest.mark.parametrize("scope,digest", [(0, 3), (7, 3), (0, 2), (9, 4)])
def test_a_produced_batch_goes_as_runs_that_fit_a_frame(scope, digest):
    """encode_produced with runs (E == Qw): each run one PendingAdd of consecutive ids,
    at most run_count entries and run_bytes sized bytes (an entry over it a run alone);
    the frame built from the runs is byte for byte the frame of the entries one by one."""
    mk = mac_key(b"pw") if digest == 2 else None
    rng = random.Random(scope * 10 + digest)
    # small entries first (runs cut by count), then mixed (cut by bytes), some over the limit
    datas = [rng.randbytes(rng.choice([0, 1, 100] if i < 300 else [0, 1000, 5000, 25_000]))
             for i in range(700)]
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    last = AddFuture()
    eid, length = addpath.encode_produced(packed(datas), last, scope, 42, 100, 99, 7, digest,
                                          mk, pending, ops, 20_000, 50)
    assert (eid, length) == (800, 7 + sum(map(len, datas)))
    assert list(pending) == [op.entry_id for op in ops] and ops[0].entry_id == 100
    assert all(a.last_id + 1 == b.entry_id for a, b in zip(ops, ops[1:])) and ops[-1].last_id == 799
    assert [op.future for op in ops] == [None] * (len(ops) - 1) + [last]
    entries, running = [], 7
    for i, d in enumerate(datas):
        running += len(d)
        entries.append(encode_entry(scope, 42, 100 + i, 99, running, digest, d, mk))
    for op in ops:
        assert 1 <= op.count <= 50 and (len(op.data) <= 20_000 or op.count == 1)
        assert frames.sized_entries(op.data) == op.count
        assert op.length == 7 + sum(map(len, datas[:op.last_id - 99]))
    assert any(op.count == 50 for op in ops) and any(1 < op.count < 50 for op in ops)
    assert any(len(op.data) > 20_000 for op in ops)
    cuts = addpath.frame_cuts(ops, 20_000, 50)
    for a, b in zip([0] + cuts, cuts):
        frame = frames.add_request_sized(5, scope, 42, KEY, [op.data for op in ops[a:b]], 0, 3)
        want = frames.add_request(5, scope, 42, KEY, entries[ops[a].entry_id - 100:ops[b - 1].last_id - 99], 0, 3)
        assert frame == want
    # the runs' acknowledgement completes the batch's future with the last id
    quorums = [["b0"]]
    addpath.ack(ops, "b0", pending, quorums)
    done = addpath.acknowledged_run(pending, 1, quorums)
    assert done == ops and not pending
    addpath.set_results(done)
    assert last.result(0) == 799


def test_packed_takes_and_sized_parts_are_bounded():
    """What encode_produced and add_request_sized are given is checked before any copy:
    ends out of order or past the data, sizes running past a part's end."""
    pending: collections.OrderedDict = collections.OrderedDict()
    for data, ends in ((b"abc", struct.pack("=2q", 2, 1)), (b"abc", struct.pack("=1q", 4)),
                       (b"abc", struct.pack("=1q", 2)), (b"abc", b""), (b"abc", b"\0" * 5),
                       (b"abc", struct.pack("=1q", -1))):
        with pytest.raises(IllegalOpError):
            addpath.encode_produced((data, ends), AddFuture(), 0, 1, 0, -1, 0, 3, None, pending, [],
                                    1000, 10)
    assert not pending
    good = addpath.sized(b"entry")
    assert good == P.U32.pack(5) + b"entry" and frames.sized_entries(good + good) == 2
    for bad in (good[:-1], good + b"\0", b"\xff\xff\xff\xff" + b"x", b"\0\0"):
        with pytest.raises(IllegalOpError):
            frames.add_request_sized(1, 0, 1, KEY, [good, bad])
    with pytest.raises(IllegalOpError):
        frames.add_request_sized(1, 0, 1, KEY, [bytearray(good)])
    assert frames.add_request_sized(1, 0, 1, KEY, [good, good]) == \
        frames.add_request(1, 0, 1, KEY, [b"entry", b"entry"])

"""Streams (unbounded ledgers): terms instead of fencing, recovery at every term, the
truncating no-op, rollover and retention (seed 001)."""
import concurrent.futures
import threading
import time

import pytest

import embedlog
from embedlog.errors import EmbedlogError, InvalidTermError, NoSuchEntryError, NoSuchLedgerError
from embedlog.harness import LocalCluster
from embedlog.net import protocol as P


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "cluster"), autorecovery=False) as lc:
        yield lc


def raw_read(client, bookie_id, lid, eid):
    """The encoded entry a bookie stores at ``eid``, or None."""
    ctx = client._ctx

    async def ask():
        try:
            resp = await ctx.call(bookie_id, lambda rid: P.read_request(
                rid, lid.scope_id, lid.ledger_id, eid), 5)
            entries = P.parse_read_body(resp.body)[1]
            return entries[0][1] if entries else None
        except (NoSuchEntryError, NoSuchLedgerError):
            return None

    return ctx.run(ask())


def test_seed_counterexample_no_log_divergence(cluster):
    """c1 writes A and B; B reaches one bookie only; c2 takes over, recovers, writes C.
    Afterwards every bookie holding an entry at or below the LAC holds the same bytes,
    and no reader ever sees B."""
    c1, c2 = cluster.client(add_timeout_s=8), cluster.client()
    s1 = c1.open_stream("divergence", ensemble_size=3, write_quorum=3, ack_quorum=2)
    s1.take_over()
    ens = list(s1.metadata.fragments[-1][1])
    b1, b2, b3 = (cluster.index_of(b) for b in ens)
    pos_a = s1.append(b"A")
    cluster.proxy(b2).drop(True)                  # c1 can no longer reach b2 and b3
    cluster.proxy(b3).drop(True)
    fut_b = s1.append_async(b"B")                 # reaches b1 only: never acknowledged
    lid = s1.ledger_id
    watcher = cluster.client()
    deadline = time.monotonic() + 10
    while raw_read(watcher, ens[0], lid, pos_a + 1) is None:
        assert time.monotonic() < deadline, "B never reached b1"
        time.sleep(0.02)
    assert not fut_b.done()
    # c2 talks to b2 and b3 directly; b1 answers it slowly, so b2 and b3 decide
    c2._ctx.address_of_async = _pinned(c2._ctx, {
        ens[1]: f"127.0.0.1:{cluster._b(b2).port}", ens[2]: f"127.0.0.1:{cluster._b(b3).port}"})
    cluster.proxy(b1).delay(0.5)
    s2 = c2.open_stream("divergence")
    next_pos = s2.take_over()
    pos_c = s2.append(b"C")
    cluster.proxy(b1).heal()
    cluster.proxy(b2).heal()
    cluster.proxy(b3).heal()
    with pytest.raises(EmbedlogError):          # B is never acknowledged (bounced or timed out)
        fut_b.result(30)
    lac = s2.last_position()
    assert lac >= pos_c > next_pos - 1
    reader = cluster.client()
    md = reader.open_stream("divergence").metadata
    holders = {b for _f, e in md.fragments for b in e} | set(ens)
    for eid in range(0, lac + 1):
        copies = {raw_read(reader, b, lid, eid) for b in holders} - {None}
        assert len(copies) <= 1, f"entry {eid} differs between bookies"
    seen = [(e.position, e.data) for e in reader.open_stream("divergence").read(0)]
    assert (pos_a, b"A") in seen and (pos_c, b"C") in seen
    assert b"B" not in [d for _p, d in seen]


def _pinned(ctx, pins):
    """Route a client to some bookies by address, around their fault proxies."""
    orig = ctx.address_of_async

    async def address(bookie_id):
        return pins[bookie_id] if bookie_id in pins else await orig(bookie_id)
    return address


def test_stale_term_writer_never_gets_a_false_ack(cluster):
    c1, c2 = cluster.client(), cluster.client()
    s1 = c1.open_stream("stale")
    s1.append_many([b"x%d" % i for i in range(20)])
    acked = []
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            try:
                acked.append((s1.append(b"w%d" % i), b"w%d" % i))
            except InvalidTermError:
                return
            i += 1

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.2)
    s2 = c2.open_stream("stale")
    s2.take_over()
    stop.set()
    t.join(20)
    with pytest.raises(InvalidTermError):
        s1.append(b"after")
    with pytest.raises(InvalidTermError):       # stays out until it takes over again
        s1.append(b"again")
    got = {e.position: e.data for e in cluster.client().open_stream("stale").read(0)}
    for pos, data in acked:
        assert got.get(pos) == data


def test_competing_take_overs_one_wins(cluster):
    clients = [cluster.client() for _ in range(3)]
    streams = [c.open_stream("contest") for c in clients]
    streams[0].append(b"seed")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda s: _try(s.take_over), streams))
    writers = []
    for s in streams:
        try:
            s.append(b"who")
            writers.append(s)
        except InvalidTermError:
            pass
    assert len(writers) == 1, outcomes
    assert writers[0].term == max(s.refresh().term for s in streams)


def test_a_clean_release_lets_the_next_writer_go_on_without_a_gap(cluster):
    """Issue 17 item 3: a leader that closes cleanly releases its term; the next writer
    appends right after its last position (no recovery, no no-op), and a reader sees the
    positions without a gap. A leader that did not release is taken over as before."""
    a, b, c = (cluster.client(n) for n in ("a", "b", "c"))
    s = a.open_stream("released")
    first = s.append_many([b"1", b"2"])
    s.close()
    t = b.open_stream("released")
    assert t.append(b"3") == first + 1 and t.append(b"4") == first + 2
    reader = c.open_stream("released")
    _wait_committed(reader, first + 2)           # the writer's explicit LAC reaches the bookies
    assert [e.data for e in reader.read(first - 1)] == [b"1", b"2", b"3", b"4"]
    # t is still the leader (it did not release): the next writer takes over, with a gap
    u = c.open_stream("released")
    after = u.append(b"5")
    assert after == first + 4                         # first + 3 is the take-over's no-op
    with pytest.raises(InvalidTermError):
        t.append(b"stale")
    _wait_committed(u, after)
    assert [e.position for e in u.read(0)] == [first - 1, first, first + 1, first + 2, after]


def test_two_writers_racing_for_a_released_stream_one_wins(cluster):
    """The release mark is used once: the CAS that raises the term clears it, so of racing
    take-overs one may skip recovery and the later ones recover (and fence it)."""
    s = cluster.client().open_stream("release-race")
    last = s.append_many([b"x"] * 5)
    s.close()
    streams = [cluster.client().open_stream("release-race") for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda st: _try(st.take_over), streams))
    positions = []
    for st in streams:
        try:
            positions.append(st.append(b"z"))
        except InvalidTermError:
            pass
    assert len(positions) == 1 and positions[0] > last
    _wait_committed(streams[0], positions[0])
    assert [e.data for e in streams[0].read(0)] == [b"x"] * 5 + [b"z"]


def test_a_failed_release_leaves_the_next_writer_to_recover(cluster):
    gate = cluster.faults.gate("release", action="fail")
    s = cluster.client("a").open_stream("no-release")
    last = s.append(b"1")
    s.close()
    assert gate.hits == 1
    t = cluster.client("b").open_stream("no-release")
    assert t.append(b"2") == last + 2                 # recovered, with the no-op between


def _wait_committed(stream, position, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while stream.last_position() < position:
        assert time.monotonic() < deadline, f"position {position} never committed"
        time.sleep(0.02)


def _try(fn):
    try:
        return fn()
    except InvalidTermError as exc:
        return exc


def test_terms_on_a_bookie_that_never_saw_the_ledger(cluster):
    c = cluster.client()
    s = c.open_stream("fresh", ensemble_size=3, write_quorum=3, ack_quorum=2)
    outsider = next(cluster.bookie_id(i) for i in range(len(cluster))
                    if cluster.bookie_id(i) not in s.metadata.fragments[0][1])
    lid = s.ledger_id
    from embedlog._native.format import encode_entry, master_key
    key = master_key(b"")

    async def call(build):
        return await c._ctx.call(outsider, build, 5)

    # a recovery LAC read with term 5 makes the unknown ledger known at term 5
    c._ctx.run(call(lambda rid: P.read_lac_request(rid, lid.scope_id, lid.ledger_id,
                                                   P.FLAG_RECOVERY_READ, key, 5)))
    entry = encode_entry(lid.scope_id, lid.ledger_id, 0, -1, 1, "crc32c", b"\0x")
    with pytest.raises(InvalidTermError):
        c._ctx.run(call(lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, key, [entry], 0, 4)))
    c._ctx.run(call(lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, key, [entry], 0, 5)))
    c._ctx.run(call(lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, key, [entry], 0, 6)))
    with pytest.raises(InvalidTermError):       # adopted 6
        c._ctx.run(call(lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, key, [entry], 0, 5)))


def test_take_over_while_a_bookie_is_down(cluster):
    c1, c2 = cluster.client(), cluster.client()
    s1 = c1.open_stream("down", ensemble_size=3, write_quorum=3, ack_quorum=2)
    positions = [s1.append(b"d%d" % i) for i in range(30)]
    cluster.kill_bookie(cluster.index_of(s1.metadata.fragments[-1][1][1]))
    s2 = c2.open_stream("down")
    s2.take_over()
    new = s2.append(b"after")
    got = {e.position: e.data for e in s2.read(0)}
    assert [got[p] for p in positions] == [b"d%d" % i for i in range(30)]
    assert got[new] == b"after"


def test_truncation_survives_a_bookie_restart(cluster):
    c1, c2 = cluster.client(add_timeout_s=8), cluster.client()
    s1 = c1.open_stream("restart", ensemble_size=3, write_quorum=3, ack_quorum=2)
    pos = s1.append(b"kept") + 1                 # where the dirty entry goes
    ens = list(s1.metadata.fragments[-1][1])
    idx = [cluster.index_of(b) for b in ens]
    for i in idx[1:]:
        cluster.proxy(i).drop(True)
    s1.append_async(b"dirty")                   # only ens[0] stores it
    lid = s1.ledger_id
    watcher = cluster.client()
    deadline = time.monotonic() + 10
    while raw_read(watcher, ens[0], lid, pos) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # the new leader reaches ens[1], ens[2] directly and ens[0] slowly: they decide
    c2._ctx.address_of_async = _pinned(c2._ctx, {b: f"127.0.0.1:{cluster._b(i).port}"
                                                 for b, i in zip(ens[1:], idx[1:])})
    cluster.proxy(idx[0]).delay(0.5)
    s2 = c2.open_stream("restart")
    s2.take_over()                              # the no-op truncates "dirty" on ens[0]
    cluster.proxy(idx[0]).heal()
    assert raw_read(watcher, ens[0], lid, pos + 1) is None
    cluster.kill_bookie(idx[0])
    cluster.restart_bookie(idx[0])
    from embedlog._native.format import decode_entry
    data = raw_read(cluster.client(), ens[0], lid, pos)
    assert data is not None and decode_entry(data, lid.scope_id, lid.ledger_id, pos, "crc32c")[:1] == b"\x01"
    assert b"dirty" not in [e.data for e in s2.read(0)]


def test_rollover_and_retention_keep_metadata_bounded(cluster):
    c = cluster.client()
    s = c.open_stream("long", rollover_entries=50, retention_entries=200)
    for i in range(0, 1000, 25):
        s.append_many([b"r%d" % k for k in range(i, i + 25)])
    md = s.refresh()
    assert len(md.fragments) <= 6, md.fragments
    assert md.first_entry_id >= 1000 - 300
    with pytest.raises(NoSuchEntryError):
        list(s.read(0))
    got = [e.data for e in s.read(md.first_entry_id)]
    assert got and got[-1] == b"r999"
    bookies = {b for _f, e in md.fragments for b in e}
    spread = {b for b in bookies}
    assert len(spread) >= 3
    # the bookies forgot the trimmed entries
    first_fragment_bookies = md.fragments[0][1]
    assert all(raw_read(c, b, s.ledger_id, 5) is None for b in first_fragment_bookies)


def test_streams_by_name_and_pattern(cluster):
    c = cluster.client()
    for name in ("orders.eu", "orders.us", "clicks"):
        c.open_stream(name).append(name.encode())
    assert c.list_streams() == ["clicks", "orders.eu", "orders.us"]
    assert c.list_streams("orders.*") == ["orders.eu", "orders.us"]
    c.delete_stream("clicks")
    assert c.list_streams() == ["orders.eu", "orders.us"]
    with pytest.raises(NoSuchLedgerError):
        c.open_stream("clicks", create=False)


def test_tailing_a_stream(cluster):
    c1, c2 = cluster.client(), cluster.client()
    s = c1.open_stream("tail")
    s.take_over()
    got = []
    t = threading.Thread(target=lambda: [got.append(e.data) for e in c2.open_stream("tail").tail(
        0, poll_timeout_ms=200, stop=lambda: len(got) >= 5)])
    t.start()
    for i in range(5):
        s.append(b"t%d" % i)
        time.sleep(0.05)
    t.join(20)
    assert got == [b"t%d" % i for i in range(5)]


def test_embedded_stream(tmp_path):
    with embedlog.open(tmp_path) as log:
        s = log.open_stream("local")
        positions = [s.append(b"e%d" % i) for i in range(10)]
        s2 = log.open_stream("local")
        s2.take_over()
        with pytest.raises(InvalidTermError):
            s.append(b"stale")
        p = s2.append(b"new")
        assert [e.data for e in s2.read(0)] == [b"e%d" % i for i in range(10)] + [b"new"]
        assert p > positions[-1] + 1                 # the no-op stands between them
        assert log.list_streams() == ["local"]
    with embedlog.open(tmp_path) as log:
        assert [e.data for e in log.open_stream("local").read(0)][-1] == b"new"


def test_random_faults_with_writers_taking_over_in_turn(tmp_path):
    import os
    from support.stream_chaos import StreamChaos
    seed = int(os.environ.get("EMBEDLOG_CHAOS_SEED", "7"))
    with LocalCluster(bookies=5, base_dir=str(tmp_path / "c"), autorecovery=False) as lc:
        chaos = StreamChaos(lc, seed, duration_s=float(os.environ.get("EMBEDLOG_CHAOS_SECONDS", "12")))
        chaos.run()
        violations = chaos.check()
        assert not violations, (seed, violations[:10], chaos.actions)
        assert chaos.total_acked > 50 and len(chaos.actions) >= 5


def test_a_deleted_stream_name_can_be_used_again(tmp_path):
    """Deleting a stream leaves a deletion record and bookies refuse the old id: the name
    gets a fresh id (the next free probe) and a clean stream."""
    import embedlog
    with embedlog.open(tmp_path / "d") as log:
        s = log.open_stream("again")
        s.append(b"old")
        first = s.ledger_id
        log.delete_stream("again")
        s2 = log.open_stream("again")
        assert s2.ledger_id != first
        assert [e.data for e in s2.read(0)] == []
        s2.append(b"new")
        assert [e.data for e in s2.read(0)] == [b"new"]
        assert log.list_streams() == ["again"]


def test_threads_sharing_a_new_stream_handle_take_the_lead_once(cluster):
    """The first appends of several threads on one handle: one take-over, not one per
    thread (each fenced the others: InvalidTermError on the handle's own appends), and
    each append_many's positions consecutive."""
    c = cluster.client(max_pending_adds=3)
    s = c.open_stream("shared")
    go = threading.Barrier(4)
    calls, errors = [], []

    def append(t):
        go.wait()
        try:
            for k in range(5):
                items = [b"%d.%d.%d" % (t, k, i) for i in range(1 + (t + k) % 7)]
                calls.append((s.append_many(items), items))
        except EmbedlogError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == [] and len(calls) == 20
    assert s.term == 1
    s.close()
    got = {e.position: e.data for e in cluster.client().open_stream("shared").read(0)}
    for last, items in calls:
        assert [got[p] for p in range(last - len(items) + 1, last + 1)] == items


def test_a_stream_on_three_bookies_survives_losing_one(tmp_path):
    """Issue 27 item 11: streams default to E = Qw = Qa = 2, so on 3 bookies a spare replaces
    a lost bookie: the leader goes on appending and a new leader takes over while the bookie
    is down. Positions start at 0, the first position the metadata (`stream list -m`) shows."""
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "cluster"), autorecovery=False) as lc:
        c1, c2 = lc.client(), lc.client()
        s1 = c1.open_stream("three")
        assert s1.append(b"a") == 0 == s1.refresh().first_entry_id
        lc.kill_bookie(lc.index_of(s1.metadata.fragments[-1][1][0]))
        s1.append(b"b")
        s2 = c2.open_stream("three")
        s2.take_over()
        last = s2.append(b"c")
        _wait_committed(s2, last)
        assert [e.data for e in s2.read(0)] == [b"a", b"b", b"c"]


def test_rollover_splits_one_append_many(cluster):
    """Issue 27 item 11: one append_many bigger than rollover_entries fills fragments of
    that size, so truncate_before has whole fragments to remove."""
    s = cluster.client().open_stream("split", rollover_entries=10)
    last = s.append_many([b"x%d" % i for i in range(35)])
    assert last == 34
    assert [first for first, _ens in s.refresh().fragments] == [0, 10, 20, 30]
    assert s.truncate_before(last) == 30
    _wait_committed(s, last)
    assert [e.data for e in s.read(30)] == [b"x%d" % i for i in range(30, 35)]
    with pytest.raises(NoSuchEntryError):
        list(s.read(29))

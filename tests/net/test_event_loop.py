"""The optional uvloop event loop (EMBEDLOG_EVENT_LOOP=uvloop): a served cluster and its
client run on it end to end; a wrong choice is a clear ConfigError."""
import pytest

from embedlog.errors import ConfigError
from embedlog.harness import LocalCluster
from embedlog.net import loop as event_loop


def test_bookies_and_client_on_uvloop(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDLOG_EVENT_LOOP", "uvloop")    # inherited by the bookie processes
    import uvloop
    with LocalCluster(bookies=3, base_dir=str(tmp_path), autorecovery=False) as lc:
        client = lc.client()
        try:
            assert isinstance(client._ctx.loop, uvloop.Loop)
            w = client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            futs = [w.append_async(b"e%d" % i) for i in range(500)]
            assert [f.result(timeout=60) for f in futs] == list(range(500))
            w.close()
            r = client.open_ledger(w.ledger_id)
            assert r.read_batch(0, 499) == [b"e%d" % i for i in range(500)]
        finally:
            client.close()


def test_the_default_is_asyncio_and_a_wrong_choice_is_named(monkeypatch):
    monkeypatch.delenv("EMBEDLOG_EVENT_LOOP", raising=False)
    assert event_loop.loop_name() == "asyncio"
    monkeypatch.setenv("EMBEDLOG_EVENT_LOOP", "trio")
    with pytest.raises(ConfigError, match="EMBEDLOG_EVENT_LOOP"):
        event_loop.new_event_loop()

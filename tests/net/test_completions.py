"""net/completions.py: the journal thread's completions run on the loop in one drain; the
answers a drain's completions send to one connection go out in one write, in order; a lone
completion's answer goes out at once, before the rest of its completion's work."""
from __future__ import annotations

import asyncio
import threading

from embedlog.net.completions import Completions


class FakeWriter:
    def __init__(self, log: list):
        self.log = log

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.log.append(("write", [data]))

    def writelines(self, parts) -> None:
        self.log.append(("write", list(parts)))


def test_a_lone_completion_answers_before_the_rest_of_its_work():
    async def main():
        log = []
        comp = Completions(asyncio.get_running_loop())
        writer = FakeWriter(log)

        def answer():
            comp.send(writer, b"answer")
            log.append(("after", None))          # the server's metrics, pollers

        t = threading.Thread(target=comp.complete, args=(answer,))
        t.start()
        t.join()
        for _ in range(3):
            await asyncio.sleep(0)
        assert log == [("write", [b"answer"]), ("after", None)]

    asyncio.run(main())


def test_a_drain_of_several_writes_once_per_connection_in_order():
    async def main():
        log_a, log_b = [], []
        comp = Completions(asyncio.get_running_loop())
        a, b = FakeWriter(log_a), FakeWriter(log_b)
        # queued before the loop runs the drain: one drain runs all three
        comp.complete(comp.send, a, b"1")
        comp.complete(comp.send, b, b"x")
        comp.complete(comp.send, a, b"2", b"3")
        for _ in range(3):
            await asyncio.sleep(0)
        assert log_a == [("write", [b"1", b"2", b"3"])]
        assert log_b == [("write", [b"x"])]

    asyncio.run(main())


def test_a_failing_completion_does_not_strand_the_others():
    async def main():
        log = []
        comp = Completions(asyncio.get_running_loop())
        w = FakeWriter(log)

        def bad():
            raise ValueError("a completion's bug")

        comp.complete(bad)
        comp.complete(comp.send, w, b"ok")
        for _ in range(3):
            await asyncio.sleep(0)
        comp.complete(bad)                      # a lone one too
        for _ in range(3):
            await asyncio.sleep(0)
        comp.complete(comp.send, w, b"again")
        for _ in range(3):
            await asyncio.sleep(0)
        assert log == [("write", [b"ok"]), ("write", [b"again"])]

    asyncio.run(main())

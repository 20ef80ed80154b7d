"""A TCP fault proxy in front of one bookie: delay, drop or cut its traffic on demand."""
from __future__ import annotations

import asyncio
import socket
import threading


class FaultProxy:
    """Listens on ``listen_port`` and forwards to ``target``; faults apply to both directions.

    - ``delay(seconds)``: hold every chunk that long before forwarding it;
    - ``drop(True)``: swallow everything (connections stay open, nothing arrives);
    - ``cut()``: close every connection and refuse new ones until ``heal()``.
    """

    def __init__(self, target_port: int, listen_port: int = 0, host: str = "127.0.0.1"):
        self.host = host
        self.target_port = target_port
        self._delay_s = 0.0
        self._drop = False
        self._cut = False
        self._conns: set = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listen_port,), daemon=True,
                                        name="embedlog-fault-proxy")
        self._thread.start()
        self._ready.wait(10)

    def _run(self, listen_port: int) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, listen_port))
        self.port = sock.getsockname()[1]
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, sock=sock))
        self._ready.set()
        self._loop.run_forever()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def retarget(self, target_port: int) -> None:
        self.target_port = target_port

    def delay(self, seconds: float) -> None:
        self._delay_s = max(0.0, float(seconds))

    def drop(self, flag: bool = True) -> None:
        self._drop = bool(flag)

    def cut(self) -> None:
        self._cut = True
        self._loop.call_soon_threadsafe(self._close_all)

    def heal(self) -> None:
        self._cut = False
        self._drop = False
        self._delay_s = 0.0

    def _close_all(self) -> None:
        for w in list(self._conns):
            w.close()

    async def _handle(self, creader, cwriter) -> None:
        if self._cut:
            cwriter.close()
            return
        try:
            breader, bwriter = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            cwriter.close()
            return
        self._conns.update((cwriter, bwriter))
        try:
            await asyncio.gather(self._pump(creader, bwriter), self._pump(breader, cwriter))
        except asyncio.CancelledError:
            # the proxy is closing: end quietly. A connection task that ends cancelled makes
            # asyncio's streams log "Exception in callback ... CancelledError" (Python 3.11)
            pass
        finally:
            for w in (cwriter, bwriter):
                self._conns.discard(w)
                w.close()

    async def _pump(self, reader, writer) -> None:
        try:
            while not self._cut:
                data = await reader.read(65536)
                if not data:
                    break
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
                if self._drop or self._cut:
                    continue
                if writer.is_closing():
                    break          # the other side is gone: writing more only makes asyncio log
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def stop():
            self._server.close()
            self._close_all()
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            self._loop.stop()

        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.create_task, stop())
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

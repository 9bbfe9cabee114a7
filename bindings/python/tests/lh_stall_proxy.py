"""A loopback TCP proxy that can hold back the server's replies: a stalled server (or network)
for the tests of an application call's bound.

Runs its own asyncio loop on a thread. While ``delay`` is above zero, every chunk the server
sends waits that many seconds before it goes on to the client (requests pass at once, so
the server acts on them; only the answers are late).
"""

from __future__ import annotations

import asyncio
import threading


class StallProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.delay = 0.0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), name="stall-proxy", daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the stall proxy did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, sw))

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while True:
                    data = await r.read(65536)
                    if not data:
                        break
                    if replies and self.delay > 0:
                        await asyncio.sleep(self.delay)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        try:
            await asyncio.gather(pipe(cr, sw, False), pipe(sr, cw, True))
        except asyncio.CancelledError:  # close()
            pass

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for w in self._writers:
                w.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

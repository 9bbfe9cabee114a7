"""A loopback TCP proxy that can drop connections mid-reply (the harness's network fault).

Runs its own asyncio loop on a thread. While ``dropping`` is set, each chunk the server sends
is, with probability ``p``, cut in half: the first half goes to the client, then both sides
are closed, so the client sees a torn reply.
"""

from __future__ import annotations

import asyncio
import random
import threading


class Proxy:
    def __init__(self, target: tuple[str, int], seed: int, p: float = 0.3) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.p = p
        self.dropping = False
        self.drops = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.addr = ("127.0.0.1", self.port)

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

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while True:
                    data = await r.read(65536)
                    if not data:
                        break
                    if replies and self.dropping and self.rng.random() < self.p:
                        self.drops += 1
                        w.write(data[: max(1, len(data) // 2)] if len(data) > 1 else b"")
                        await w.drain()
                        break
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                for x in (cw, sw):
                    x.close()

        await asyncio.gather(pipe(cr, sw, False), pipe(sr, cw, True))

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(5)

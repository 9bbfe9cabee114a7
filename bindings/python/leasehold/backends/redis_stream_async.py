"""``AsyncRedisStreamExecutor``: the asyncio twin of
:class:`~leasehold.backends.redis_stream.RedisStreamExecutor`. The core owns the Redis wire;
this executor opens the connections on the event loop (``loop.create_connection``, TLS with the
standard ``ssl`` module, Unix sockets) and moves bytes, no Redis client::

    from leasehold import AsyncLockClient
    from leasehold.backends.redis_stream_async import AsyncRedisStreamExecutor

    async with AsyncLockClient(AsyncRedisStreamExecutor("redis://127.0.0.1:6379/0")) as client:
        async with client.acquire("reports", ttl=10, wait=5) as lock:
            await write_report(fencing_token=lock.fencing_token)

Everything runs on the client's loop, no thread: a write goes to the transport at once (it
buffers what the socket cannot take now), and what arrives is fed to the core from the
transport's callback. No call blocks the loop, so an ``acquire()`` or ``release()`` waits only
for its own answer, within its own bound. ``AsyncLockClient`` given a ``RedisStreamExecutor``
(or ``RedisLockService.from_url(...)``) runs this twin of it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Any

from .._options import RedisOptions, RedisStreamOptions
from .._values import StreamOpen

__all__ = ["AsyncRedisStreamExecutor"]

_EOF = "end of stream"


def _why(e: BaseException) -> str:
    return str(e) or type(e).__name__


class _Conn(asyncio.Protocol):
    """One stream's connection: bytes in go to the core (through the sink) as they come."""

    def __init__(self, stream: int, sink: Any, streams: dict[int, "_Conn"]) -> None:
        self.id = stream
        self.sink = sink
        self.streams = streams
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # written before the connection was made
        self.closed = False  # no more IO (shut down, failed or ended)
        self.reported = False  # the core was told it closed (or asked for it)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.closed:
            self.sink.received(self.id, data)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.streams.get(self.id) is self:
            del self.streams[self.id]
        if not self.reported:
            self.reported = True
            self.sink.closed(self.id, _why(exc) if exc is not None else _EOF)

    def end(self) -> None:
        """No more IO and nothing to report (the core asked, or the client stopped)."""
        self.reported = self.closed = True
        if self.transport is not None:
            self.transport.abort()


class AsyncRedisStreamExecutor:
    """Moves the bytes of the core's Redis connections on the event loop (see the module
    docs). Parameters as for :class:`~leasehold.backends.redis_stream.RedisStreamExecutor`."""

    backend_protocol = "stream"
    notifications = True

    def __init__(
        self,
        url: str,
        *,
        client_name: str | None = None,
        options: RedisOptions | None = None,
        ssl_context: ssl.SSLContext | None = None,
        keepalive: bool = False,
        stream_options: RedisStreamOptions | None = None,
    ) -> None:
        self.url = url
        self.options = stream_options or RedisStreamOptions(url, client_name=client_name, redis=options or RedisOptions())
        self._ssl = ssl_context
        self._keepalive = keepalive
        self._streams: dict[int, _Conn] = {}

    def attach(self, sink: Any = None) -> None:
        """Nothing to set up: the core asks for its streams."""

    def settings(self) -> dict[str, Any]:
        """As :meth:`leasehold.backends.redis_stream.RedisStreamExecutor.settings`."""
        return {"url": self.url, "stream_options": self.options, "ssl_context": self._ssl, "keepalive": self._keepalive}

    async def open(self, req: StreamOpen, sink: Any) -> None:
        """Connect (within the request's deadline), then ``sink.opened``; raises when the
        connection cannot be made (the core is told the stream closed)."""
        conn = _Conn(req.stream, sink, self._streams)
        self._streams[req.stream] = conn
        loop = asyncio.get_running_loop()
        timeout = min(max((req.deadline - time.monotonic_ns()) / 1e9, 0.05), 60.0)
        try:
            async with asyncio.timeout(timeout):
                if req.unix_path:
                    await loop.create_unix_connection(lambda: conn, req.unix_path)
                elif req.tls:
                    ctx = self._ssl or ssl.create_default_context()
                    await loop.create_connection(lambda: conn, req.host, req.port, ssl=ctx, server_hostname=req.server_name)
                else:
                    await loop.create_connection(lambda: conn, req.host, req.port)
        except Exception:
            if self._streams.get(req.stream) is conn:
                del self._streams[req.stream]
            if conn.reported:  # shut down meanwhile: nobody wants to hear of it
                return
            conn.reported = conn.closed = True
            raise
        if conn.closed:  # shut down while connecting
            conn.end()
            return
        if self._keepalive and not req.unix_path:
            sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sink.opened(req.stream)
        early, conn.early = conn.early, []
        for data in early:
            conn.transport.write(data)  # type: ignore[union-attr]

    async def write(self, stream: int, data: bytes) -> None:
        """Hand ``data`` to the stream's transport now (it keeps what the socket cannot take
        yet, in order)."""
        if not self.write_now(stream, data):
            raise ConnectionError(f"stream {stream} is not open")

    def write_now(self, stream: int, data: bytes) -> bool:
        """:meth:`write` without a task (the client calls it from its drain): False when the
        stream is unknown (its ``open`` has not started, or it ended), and :meth:`write` must
        run; raises on a stream that closed. Bytes written before the connection is made
        wait, in order, until it is."""
        conn = self._streams.get(stream)
        if conn is None:
            return False
        if conn.closed:
            raise ConnectionError(f"stream {stream} is not open")
        if conn.transport is None or conn.early:
            conn.early.append(data)
        else:
            conn.transport.write(data)
        return True

    async def shutdown(self, stream: int) -> None:
        """Close ``stream`` (the core asked: its end is not reported)."""
        conn = self._streams.pop(stream, None)
        if conn is not None:
            conn.end()

    async def detach(self) -> None:
        """The client stopped: every stream closes."""
        streams, self._streams = list(self._streams.values()), {}
        for conn in streams:
            conn.end()
        # The streams' closing callbacks run now, on this loop, not after it is gone.
        await asyncio.sleep(0)

    close = detach

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's streams."""
        self._streams = {}

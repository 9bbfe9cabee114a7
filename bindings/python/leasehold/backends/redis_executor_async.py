"""The asyncio Redis executor (``redis.asyncio``) for ``AsyncLockClient``.

The twin of :mod:`leasehold.backends.redis_executor`: it runs the core's requests verbatim on
a pooled commands connection and one subscriber connection, and hands back raw replies,
pub/sub messages and subscription changes. It knows nothing of the protocol. Redis Sentinel:
:meth:`AsyncRedisExecutor.from_sentinel`.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Iterable

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from .._core import RedisOptions
from .redis_connect import async_connection_pool, async_sentinel_pool
from .redis_executor import Sink, _address, error_value

__all__ = ["AsyncRedisExecutor", "async_connection_pool", "async_sentinel_pool"]


class AsyncRedisExecutor:
    """Runs a Redis-protocol core's requests with ``redis.asyncio`` (on one event loop);
    give it to ``AsyncLockClient`` in place of a service. One client at a time.

    Parameters as for :class:`~leasehold.backends.redis_executor.RedisExecutor`, with a
    ``redis.asyncio`` client or pool.
    """

    backend_protocol = "redis"
    notifications = True

    @classmethod
    def from_sentinel(
        cls,
        sentinels: str | Iterable[str | tuple[str, int]],
        master_name: str,
        *,
        options: RedisOptions | None = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        **redis_kwargs: Any,
    ) -> AsyncRedisExecutor:
        """As :meth:`leasehold.backends.redis_executor.RedisExecutor.from_sentinel`."""
        pool = async_sentinel_pool(sentinels, master_name, sentinel_kwargs=sentinel_kwargs, **redis_kwargs)
        return cls(pool, options=options, owns_pool=True)

    def __init__(
        self,
        client: aredis.Redis | aredis.ConnectionPool | None = None,
        *,
        url: str | None = None,
        options: RedisOptions | None = None,
        owns_pool: bool | None = None,
        **redis_kwargs: Any,
    ) -> None:
        self.pool = async_connection_pool(client, url, **redis_kwargs)
        self.options = options or RedisOptions()
        self._owns_pool = client is None if owns_pool is None else owns_pool
        param = inspect.signature(self.pool.get_connection).parameters.get("command_name")
        self._named = param is not None and param.default is inspect.Parameter.empty
        self._sub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: set[bytes] = set()
        self._attached = False
        self._idle: list[Any] = []  # command connections between calls

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        if self._attached:
            raise ValueError("this AsyncRedisExecutor already serves a client; make one per client")
        self._attached = True

    async def detach(self) -> None:
        """The client stopped: the subscriber connection closes (the pool stays usable)."""
        self._attached = False
        conn, self._sub, self._channels = self._sub, None, set()
        reader, self._reader = self._reader, None
        idle, self._idle = self._idle, []
        if reader is not None:
            reader.cancel()
        if conn is not None:
            await conn.disconnect()
        for c in idle:
            await self.pool.release(c)

    async def command(self, argv: list[bytes]) -> Any:
        """Run ``argv`` on a pooled connection; the raw reply (an error reply is returned as
        a ``ResponseError``). Raises on a transport failure."""
        pool = self.pool
        if self._idle:
            conn = self._idle.pop()  # kept out of the pool: no checks per call
        else:
            conn = await (pool.get_connection("_") if self._named else pool.get_connection())  # type: ignore[no-untyped-call]
            sub = self._sub
            if sub is not None and sub.is_connected and _address(sub) != _address(conn):
                # (Sentinel) the master moved: the subscriber breaks, and is reported lost.
                await sub.disconnect()
        try:
            await conn.send_command(*argv, check_health=False)
            reply = await conn.read_response()
        except ResponseError as e:
            reply = error_value(e)
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        self._idle.append(conn)
        return reply

    async def subscriber(self, argv: list[bytes], sink: Sink) -> None:
        """Send ``argv`` (SUBSCRIBE / UNSUBSCRIBE) on the subscriber connection, opening it
        (and its reader task) first if needed; confirmations and messages go to ``sink``."""
        if argv[0].upper() == b"SUBSCRIBE":
            self._channels.update(argv[1:])
        conn = self._sub
        try:
            if conn is None:
                # RESP2 (messages as plain replies), no read timeout: it waits for messages.
                kwargs = {k: v for k, v in self.pool.connection_kwargs.items() if not k.startswith("maint_")}
                kwargs.update(protocol=2, socket_timeout=None, socket_keepalive=True)
                conn = self._sub = self.pool.connection_class(**kwargs)
                await conn.connect()  # type: ignore[no-untyped-call]
                self._reader = asyncio.get_running_loop().create_task(self._read(conn, sink))
            await conn.send_command(*argv, check_health=False)
        except BaseException:
            await self._lost(conn, sink)
            raise

    async def _read(self, conn: Any, sink: Sink) -> None:
        try:
            while True:
                msg = await conn.read_response(disconnect_on_error=False)
                if isinstance(msg, list) and len(msg) == 3 and isinstance(msg[0], bytes):
                    kind = msg[0].lower()
                    if kind == b"message":
                        sink.message(msg[1], msg[2])
                    elif kind in (b"subscribe", b"unsubscribe"):
                        if kind == b"unsubscribe":
                            self._channels.discard(msg[1])
                        sink.subscription(msg[1], kind == b"subscribe")
        except Exception:
            await self._lost(conn, sink)

    async def _lost(self, conn: Any, sink: Sink) -> None:
        """The subscriber connection broke: every subscription on it is gone."""
        if conn is None or self._sub is not conn:
            return
        self._sub = None
        gone, self._channels = self._channels, set()
        await conn.disconnect()
        for ch in gone:
            sink.subscription(ch, False)

    async def close(self) -> None:
        """Close the subscriber connection, and the pool when owned."""
        await self.detach()
        if self._owns_pool:
            await self.pool.disconnect()
            for sentinel in getattr(getattr(self.pool, "sentinel_manager", None), "sentinels", ()):
                await (sentinel.aclose() if hasattr(sentinel, "aclose") else sentinel.close())

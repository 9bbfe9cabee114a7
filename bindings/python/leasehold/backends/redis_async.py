"""``AsyncRedisLockService``: the asyncio Redis executor under its first name.

An :class:`~leasehold.backends.redis_executor_async.AsyncRedisExecutor` that also accepts
the arguments the earlier asyncio Redis service took (see :mod:`leasehold.backends.redis`).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from .._core import RedisOptions
from .redis import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PUBSUB_LINGER,
    DEFAULT_PUBSUB_PING_INTERVAL,
    DEFAULT_SOCKET_TIMEOUT,
    ProtocolError,
)
from .redis_executor_async import AsyncRedisExecutor

__all__ = ["AsyncRedisLockService", "ProtocolError"]


class AsyncRedisLockService(AsyncRedisExecutor):
    """An :class:`~leasehold.backends.redis_executor_async.AsyncRedisExecutor` taking the
    earlier asyncio Redis service's arguments (a ``redis.asyncio.Redis`` or pool;
    ``owns_client``: ``close()`` also closes its pool). ``pubsub_ping_interval``,
    ``pubsub_linger`` and ``direct_grants`` are accepted and ignored, as for
    :class:`~leasehold.backends.redis.RedisLockService`."""

    def __init__(
        self,
        client: aioredis.Redis | aioredis.ConnectionPool | None = None,
        *,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        owns_client: bool = False,
        direct_grants: bool = True,
        options: RedisOptions | None = None,
        **executor_kwargs: Any,
    ) -> None:
        if pubsub_ping_interval <= 0:
            raise ValueError("pubsub_ping_interval must be positive")
        if pubsub_linger < 0:
            raise ValueError("pubsub_linger must be >= 0")
        executor_kwargs.setdefault("owns_pool", owns_client if client is not None else None)
        super().__init__(client, options=options, **executor_kwargs)
        self._client = client if isinstance(client, aioredis.Redis) else None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        direct_grants: bool = True,
        options: RedisOptions | None = None,
        **redis_kwargs: Any,
    ) -> AsyncRedisLockService:
        """Like :meth:`leasehold.backends.redis.RedisLockService.from_url` (no IO until used)."""
        redis_kwargs.setdefault("socket_keepalive", True)
        return cls(
            None,
            url=url,
            pubsub_ping_interval=pubsub_ping_interval,
            pubsub_linger=pubsub_linger,
            direct_grants=direct_grants,
            options=options,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            **redis_kwargs,
        )

    @property
    def client(self) -> aioredis.Redis:
        """A ``redis.asyncio`` client on this service's connection pool."""
        if self._client is None:
            self._client = aioredis.Redis(connection_pool=self.pool)
        return self._client

    async def ping(self) -> bool:
        """``True`` when the server answers PING (raises on a transport failure)."""
        reply = await self.command([b"PING"])
        if isinstance(reply, Exception):
            raise reply
        return True

    async def __aenter__(self) -> AsyncRedisLockService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

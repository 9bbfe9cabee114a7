"""``RedisLockService(client)`` / ``AsyncRedisLockService(client)``: the service API on the
redis-py executors, for an application's own redis-py client or pool (this module imports
redis-py; :mod:`leasehold.backends.redis` imports it only when such a service is made).

The service class comes first in the bases: the error that refuses an asyncio one in
``LockClient`` names ``RedisLockService``, its twin."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from .._core import RedisOptions
from .redis import (
    DEFAULT_PUBSUB_LINGER,
    DEFAULT_PUBSUB_PING_INTERVAL,
    RedisLockService,
    check_ignored,
)
from .redis_async import AsyncRedisLockService
from .redis_executor import RedisExecutor
from .redis_executor_async import AsyncRedisExecutor

__all__ = ["_RedisPyLockService", "_AsyncRedisPyLockService", "redis_py_class"]


class _RedisPyLockService(RedisLockService, RedisExecutor):  # type: ignore[misc]  # from_sentinel: the service's
    """A :class:`~leasehold.backends.redis_executor.RedisExecutor` with the service's API
    (arguments: :class:`~leasehold.backends.redis.RedisLockService`)."""

    def __init__(
        self,
        client: redis.Redis | redis.ConnectionPool | None = None,
        *,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        owns_client: bool = False,
        direct_grants: bool = True,
        options: RedisOptions | None = None,
        **executor_kwargs: Any,
    ) -> None:
        check_ignored(pubsub_ping_interval, pubsub_linger)
        executor_kwargs.setdefault("owns_pool", owns_client if client is not None else None)
        RedisExecutor.__init__(self, client, options=options, **executor_kwargs)
        self._client = client if isinstance(client, redis.Redis) else None

    @property
    def client(self) -> redis.Redis:
        """The redis-py client given, or one on the given pool."""
        if self._client is None:
            self._client = redis.Redis(connection_pool=self.pool)
        return self._client

    def ping(self) -> bool:
        """``True`` when the server answers PING (raises on a transport failure)."""
        reply = self.command([b"PING"])
        if isinstance(reply, Exception):
            raise reply
        return True

    close = RedisExecutor.close


class _AsyncRedisPyLockService(AsyncRedisLockService, AsyncRedisExecutor):
    """An :class:`~leasehold.backends.redis_executor_async.AsyncRedisExecutor` with the
    service's API (arguments: :class:`~leasehold.backends.redis_async.AsyncRedisLockService`)."""

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
        check_ignored(pubsub_ping_interval, pubsub_linger)
        executor_kwargs.setdefault("owns_pool", owns_client if client is not None else None)
        AsyncRedisExecutor.__init__(self, client, options=options, **executor_kwargs)
        self._client = client if isinstance(client, aioredis.Redis) else None

    @property
    def client(self) -> aioredis.Redis:
        """The ``redis.asyncio`` client given, or one on the given pool."""
        if self._client is None:
            self._client = aioredis.Redis(connection_pool=self.pool)
        return self._client

    async def ping(self) -> bool:
        """``True`` when the server answers PING (raises on a transport failure)."""
        reply = await self.command([b"PING"])
        if isinstance(reply, Exception):
            raise reply
        return True

    close = AsyncRedisExecutor.close


_made: dict[type, type] = {}


def redis_py_class(cls: type) -> type:
    """The class a ``RedisLockService`` (``AsyncRedisLockService``) or a subclass of one's own
    is made as on redis-py: the subclass first (its overrides of ``command``... wrap the
    executor's), then the executor with the service's API."""
    if cls is RedisLockService:
        return _RedisPyLockService
    if cls is AsyncRedisLockService:
        return _AsyncRedisPyLockService
    made = _made.get(cls)
    if made is None:
        base = _AsyncRedisPyLockService if issubclass(cls, AsyncRedisLockService) else _RedisPyLockService
        made = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _made[cls] = made
    return made

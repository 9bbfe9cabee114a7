"""``AsyncRedisLockService``: Redis for ``AsyncLockClient`` under its first name.

``AsyncRedisLockService.from_url(url)`` takes the byte path on the event loop (an
:class:`~leasehold.backends.redis_stream_async.AsyncRedisStreamExecutor`: the core owns the
wire, no redis-py); ``AsyncRedisLockService(client)`` runs the core's commands on a
``redis.asyncio`` client of the application's (an
:class:`~leasehold.backends.redis_executor_async.AsyncRedisExecutor`; needs
``leasehold[redis]``). See :mod:`leasehold.backends.redis`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._core import RedisOptions
from ..service import LockStatus
from ._redis_from_url import stream_settings
from .redis import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PUBSUB_LINGER,
    DEFAULT_PUBSUB_PING_INTERVAL,
    DEFAULT_SOCKET_TIMEOUT,
    PING_NAME,
    ProtocolError,
    _status_answer,
    check_ignored,
    lock_status,
    redis_py_missing,
)
from .redis_stream_async import AsyncRedisStreamExecutor

__all__ = ["AsyncRedisLockService", "ProtocolError"]


class AsyncRedisLockService:
    """A Redis backend executor for ``AsyncLockClient`` under the earlier asyncio service's
    name: ``AsyncRedisLockService(client, ...)`` (a ``redis.asyncio.Redis`` or pool;
    ``owns_client``: ``close()`` also closes its pool) or :meth:`from_url` (the byte path).
    ``pubsub_ping_interval``, ``pubsub_linger`` and ``direct_grants`` are accepted and ignored,
    as for :class:`~leasehold.backends.redis.RedisLockService`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> AsyncRedisLockService:
        if not hasattr(cls, "backend_protocol"):  # a redis.asyncio client of the application's
            try:
                from ._redis_py_service import redis_py_class
            except ImportError as e:
                raise redis_py_missing(f"{cls.__name__}(client)") from e
            cls = redis_py_class(cls)
        return object.__new__(cls)  # then its own __init__ runs

    options: Any

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float | None = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        direct_grants: bool = True,
        options: RedisOptions | None = None,
        **redis_kwargs: Any,
    ) -> AsyncRedisLockService:
        """As :meth:`leasehold.backends.redis.RedisLockService.from_url` (the same arguments;
        no IO until used), on the event loop; a subclass of one's own keeps ``redis.asyncio``."""
        check_ignored(pubsub_ping_interval, pubsub_linger)
        if cls is not AsyncRedisLockService:
            redis_kwargs.setdefault("socket_keepalive", True)
            return cls(
                None,
                url=url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                options=options,
                **redis_kwargs,
            )
        settings = stream_settings(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            options=options,
            kwargs=redis_kwargs,
            who="AsyncRedisLockService.from_url()",
        )
        return _AsyncRedisStreamLockService(settings)

    @property
    def client(self) -> Any:
        """A ``redis.asyncio.Redis`` on the same server (raises ``ImportError`` without
        redis-py)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    async def ping(self) -> bool:
        """``True`` when the server answers (raises on a transport failure)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    async def close(self) -> None:
        """Close the connections (and a redis-py client this service made)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    async def __aenter__(self) -> AsyncRedisLockService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncRedisStreamLockService(AsyncRedisLockService, AsyncRedisStreamExecutor):
    """:meth:`AsyncRedisLockService.from_url`'s service: an
    :class:`~leasehold.backends.redis_stream_async.AsyncRedisStreamExecutor` with the
    service's API."""

    def __init__(self, settings: Any) -> None:
        AsyncRedisStreamExecutor.__init__(self, **settings.executor)
        self._from_url = settings
        self._client: Any = None

    @property
    def client(self) -> Any:
        """A ``redis.asyncio.Redis`` made from the same URL and keywords on first use, for
        the application's own commands (the locks do not use it)."""
        if self._client is None:
            try:
                import redis.asyncio as aioredis

                from .redis_connect import async_connection_pool
            except ImportError as e:
                raise redis_py_missing("AsyncRedisLockService.client") from e
            s = self._from_url
            self._client = aioredis.Redis(connection_pool=async_connection_pool(url=s.redis_py_url, **s.redis_py))
        return self._client

    async def status(self, name: str) -> LockStatus:
        """As :meth:`leasehold.backends.redis.RedisLockService.status` (the query runs on
        connections of its own, in a worker thread)."""
        return await asyncio.to_thread(lock_status, self, name)

    async def ping(self) -> bool:
        """As :meth:`leasehold.backends.redis.RedisLockService.ping` (a status query of
        :data:`~leasehold.backends.redis.PING_NAME`, in a worker thread)."""
        st = await asyncio.to_thread(_status_answer, self, PING_NAME)
        if not st.ok:
            raise ConnectionError(st.error)
        return True

    async def close(self) -> None:
        await AsyncRedisStreamExecutor.detach(self)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
            await client.connection_pool.disconnect()

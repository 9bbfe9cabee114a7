"""``RedisLockService``: the Redis executor under its first name, with its first constructor.

The core speaks the Redis protocol itself (``docs/redis-protocol.md``); this class is a
:class:`~leasehold.backends.redis_executor.RedisExecutor` that also accepts the arguments
the earlier Redis service took, so code written for it keeps working::

    from leasehold import LockClient
    from leasehold.backends.redis import RedisLockService

    with LockClient(RedisLockService.from_url("redis://127.0.0.1:6379/0")) as client:
        with client.acquire("reports", ttl=10, wait=5) as lock:
            write_report(fencing_token=lock.fencing_token)

It delivers no ``on_release`` notifications (the protocol publishes only to queued waiters;
``LockClient.on_release`` raises ``LeaseholdError``) and grants nothing directly on release (a
release wakes the next queued client, which then acquires).
"""

from __future__ import annotations

from typing import Any

import redis

from .._core import RedisOptions
from ..service import LockStatus
from .redis_executor import RedisExecutor

__all__ = ["RedisLockService", "ProtocolError", "lock_status"]

#: Defaults used by :meth:`RedisLockService.from_url` (seconds).
DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_PUBSUB_PING_INTERVAL = 30.0
DEFAULT_PUBSUB_LINGER = 10.0


class ProtocolError(Exception):
    """Redis answered with something leasehold did not write (garbage under a lock's keys)."""


def lock_status(executor: Any, name: str) -> LockStatus:
    """What the server says about ``name``, read through the core's own status query on a
    sibling of ``executor`` (same pool, its own attachment: the executor may be serving a
    client meanwhile). Raises :class:`ProtocolError` when the core refused the reply."""
    from .._backend import backend_status

    st = backend_status(RedisExecutor(executor.pool, options=executor.options, owns_pool=False), name)
    if not st.ok:
        raise ProtocolError(st.error)
    held = bool(st.held)
    return LockStatus(
        name=name,
        held=held,
        fencing_token=st.fencing_token if held else None,
        remaining_ttl_ms=st.remaining_ttl_ms if held else None,
        holder_pid=None,
        last_fencing_token=st.last_fencing_token or None,
    )


class RedisLockService(RedisExecutor):
    """A :class:`~leasehold.backends.redis_executor.RedisExecutor` taking the earlier Redis
    service's arguments.

    :param client: a ``redis.Redis`` (or ``ConnectionPool``); used with its own options
    :param owns_client: ``close()`` also disconnects its pool
    :param options: the core's Redis protocol options (:class:`leasehold.RedisOptions`)

    ``pubsub_ping_interval``, ``pubsub_linger`` and ``direct_grants`` are accepted and ignored:
    they tuned the earlier protocol's subscriber and its direct grants (the subscriber now
    has no read timeout and TCP keepalive; a release wakes one queued client).
    """

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
        if pubsub_ping_interval <= 0:
            raise ValueError("pubsub_ping_interval must be positive")
        if pubsub_linger < 0:
            raise ValueError("pubsub_linger must be >= 0")
        executor_kwargs.setdefault("owns_pool", owns_client if client is not None else None)
        super().__init__(client, options=options, **executor_kwargs)
        self._client = client if isinstance(client, redis.Redis) else None

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
    ) -> RedisLockService:
        """Connect to ``redis://[[user]:password@]host:port/db`` (or ``rediss://``, ``unix://``).

        Socket timeouts bound every call (a hung server becomes a transport error, which the
        core retries by its own rules). No IO until the first request."""
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
    def client(self) -> redis.Redis:
        """A redis-py client on this service's connection pool."""
        if self._client is None:
            self._client = redis.Redis(connection_pool=self.pool)
        return self._client

    def ping(self) -> bool:
        """``True`` when the server answers PING (raises on a transport failure)."""
        reply = self.command([b"PING"])
        if isinstance(reply, Exception):
            raise reply
        return True

    def status(self, name: str) -> LockStatus:
        """What Redis says about ``name`` right now (read-only, advisory), read with the
        core's status query. The holder's pid, host and holding time are ``None``: the keys
        do not record them. Garbage under the name's keys raises :class:`ProtocolError`."""
        return lock_status(self, name)

    def __enter__(self) -> RedisLockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""``RedisLockService``: Redis under its first name, with its first constructors.

``RedisLockService.from_url(url)`` takes the byte path: the core owns the connections and the
wire, a :class:`~leasehold.backends.redis_stream.RedisStreamExecutor` moves the bytes with the
standard library, and redis-py is not needed. ``RedisLockService(client)`` runs the core's
commands on a redis-py client of the application's (a
:class:`~leasehold.backends.redis_executor.RedisExecutor`; that path needs
``leasehold[redis]``). Both are ``RedisLockService`` instances with the same API::

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

from .._core import RedisOptions
from ..service import LockStatus
from ._redis_from_url import stream_settings
from .redis_stream import RedisStreamExecutor
from .redis_stream_async import AsyncRedisStreamExecutor

__all__ = ["RedisLockService", "ProtocolError", "lock_status", "PING_NAME"]

#: Defaults used by :meth:`RedisLockService.from_url` (seconds).
DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_PUBSUB_PING_INTERVAL = 30.0
DEFAULT_PUBSUB_LINGER = 10.0
#: The name ``ping()`` asks the status of on the byte path (read-only: nothing is written).
PING_NAME = "leasehold-ping"

_NEEDS_REDIS_PY = "needs redis-py: pip install 'leasehold[redis]'"


class ProtocolError(Exception):
    """Redis answered with something leasehold did not write (garbage under a lock's keys)."""


def _status_answer(executor: Any, name: str) -> Any:
    """The core's status answer for ``name`` through a sibling of ``executor`` (its own
    connections, or its own attachment to the same pool: ``executor`` may be serving a client
    meanwhile)."""
    from .._backend import backend_status

    if getattr(executor, "backend_protocol", None) == "stream":
        sibling: Any = RedisStreamExecutor(**executor.settings())
    else:
        from .redis_executor import RedisExecutor

        sibling = RedisExecutor(executor.pool, options=executor.options, owns_pool=False)
    try:
        return backend_status(sibling, name)
    finally:
        sibling.close()


def lock_status(executor: Any, name: str) -> LockStatus:
    """What the server says about ``name``, read through the core's own status query on a
    sibling of ``executor`` (a ``RedisExecutor`` or a ``RedisStreamExecutor``). Raises
    :class:`ProtocolError` when the core refused the reply."""
    st = _status_answer(executor, name)
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


def check_ignored(pubsub_ping_interval: float, pubsub_linger: float) -> None:
    """The earlier service's tuning arguments are ignored, but still checked."""
    if pubsub_ping_interval <= 0:
        raise ValueError("pubsub_ping_interval must be positive")
    if pubsub_linger < 0:
        raise ValueError("pubsub_linger must be >= 0")


def redis_py_missing(what: str) -> ImportError:
    return ImportError(f"{what} {_NEEDS_REDIS_PY}")


class RedisLockService:
    """A Redis backend executor under the earlier service's name; give it to ``LockClient``
    (or ``AsyncLockClient``).

    ``RedisLockService(client, *, pubsub_ping_interval=30, pubsub_linger=10,
    owns_client=False, direct_grants=True, options=None)``: the core's commands run on
    ``client``, a ``redis.Redis`` or ``ConnectionPool`` with its own options (a
    :class:`~leasehold.backends.redis_executor.RedisExecutor`; ``owns_client``: ``close()``
    also disconnects its pool). :meth:`from_url` takes the byte path instead. A subclass of
    one's own runs on redis-py (it is a ``RedisExecutor``, whose IO methods it may wrap).

    ``pubsub_ping_interval``, ``pubsub_linger`` and ``direct_grants`` are accepted and ignored:
    they tuned the earlier protocol's subscriber and its direct grants (a release wakes one
    queued client).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> RedisLockService:
        if not hasattr(cls, "backend_protocol"):  # a redis-py client of the application's
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
    ) -> RedisLockService:
        """Connect to ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…``,
        ``unix:///path[?db=N]`` or ``redis+sentinel://…/MASTER[/db]`` on the byte path (the
        core owns the connections; no redis-py). No IO until the first request.

        ``socket_connect_timeout`` bounds each connect, ``socket_timeout`` each request (a hung
        server becomes a transport error, which the core retries by its own rules);
        ``None`` is the core's default. Of redis-py's keywords it takes ``client_name``,
        ``socket_keepalive`` (on by default), ``protocol`` (2 or 3: the handshake's first
        choice) and the TLS ones (``ssl_ca_certs``, ``ssl_ca_path``, ``ssl_certfile``,
        ``ssl_keyfile``, ``ssl_password``, ``ssl_check_hostname``, ``ssl_cert_reqs``; also as
        ``rediss://`` query parameters), or ``ssl_context``; any other raises ``TypeError``:
        for those, pass a client, ``RedisLockService(redis.Redis(...))``. A malformed URL
        raises ``ValueError``.

        A subclass of one's own (one that wraps the redis-py executor's ``command``) keeps
        the redis-py path, ``from_url`` included: its URL and keywords build a redis-py pool."""
        check_ignored(pubsub_ping_interval, pubsub_linger)
        if cls is not RedisLockService:
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
        )
        return _RedisStreamLockService(settings)

    @classmethod
    def from_sentinel(
        cls,
        sentinels: Any,
        master_name: str,
        *,
        options: RedisOptions | None = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        **redis_kwargs: Any,
    ) -> RedisLockService:
        """The redis-py path on a Sentinel deployment's master (as
        :meth:`leasehold.backends.redis_executor.RedisExecutor.from_sentinel`); the byte path
        takes ``from_url("redis+sentinel://…")``."""
        try:
            from .redis_connect import sentinel_pool
        except ImportError as e:
            raise redis_py_missing("RedisLockService.from_sentinel()") from e
        pool = sentinel_pool(sentinels, master_name, sentinel_kwargs=sentinel_kwargs, **redis_kwargs)
        return RedisLockService(pool, options=options, owns_client=True)

    # -- what both paths have ----------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """A redis-py ``redis.Redis`` on the same server (raises ``ImportError`` without
        redis-py)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    def ping(self) -> bool:
        """``True`` when the server answers (raises on a transport failure)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    def close(self) -> None:
        """Close the connections (and a redis-py client this service made)."""
        raise NotImplementedError  # pragma: no cover - by the subclasses

    def status(self, name: str) -> LockStatus:
        """What Redis says about ``name`` right now (read-only, advisory), read with the
        core's status query on connections of its own. The holder's pid, host and holding time
        are ``None``: the keys do not record them. Garbage under the name's keys raises
        :class:`ProtocolError`."""
        return lock_status(self, name)

    def __enter__(self) -> RedisLockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RedisStreamLockService(RedisLockService, RedisStreamExecutor):
    """:meth:`RedisLockService.from_url`'s service: a
    :class:`~leasehold.backends.redis_stream.RedisStreamExecutor` with the service's API."""

    def __init__(self, settings: Any) -> None:
        RedisStreamExecutor.__init__(self, **settings.executor)
        self._from_url = settings
        self._client: Any = None

    @property
    def client(self) -> Any:
        """A ``redis.Redis`` made from the same URL and keywords on first use, for the
        application's own commands (the locks do not use it)."""
        if self._client is None:
            try:
                import redis

                from .redis_connect import connection_pool
            except ImportError as e:
                raise redis_py_missing("RedisLockService.client") from e
            s = self._from_url
            if s.redis_py_url.lower().startswith(("redis+cluster:", "rediss+cluster:")):
                raise ValueError(
                    "a Redis Cluster URL has no redis.Redis client: make a redis.cluster.RedisCluster "
                    "for the application's own commands"
                )
            self._client = redis.Redis(connection_pool=connection_pool(url=s.redis_py_url, **s.redis_py))
        return self._client

    def ping(self) -> bool:
        """``True`` when the server answers the core's status query (of :data:`PING_NAME`, on
        connections of its own: handshake, credentials and database included); raises
        ``ConnectionError`` with the core's reason otherwise."""
        st = _status_answer(self, PING_NAME)
        if not st.ok:
            raise ConnectionError(st.error)
        return True

    def close(self) -> None:
        RedisStreamExecutor.detach(self)
        client, self._client = self._client, None
        if client is not None:
            client.close()
            client.connection_pool.disconnect()

    def for_asyncio(self) -> Any:
        """The asyncio twin ``AsyncLockClient`` runs; its ``close()`` closes this service too
        (a redis-py client made by :attr:`client`)."""
        return _AsyncTwin(self)


class _AsyncTwin(AsyncRedisStreamExecutor):
    """A ``from_url`` service's asyncio twin, closing the service with it."""

    def __init__(self, origin: _RedisStreamLockService) -> None:
        super().__init__(**origin.settings())
        self._origin = origin

    async def close(self) -> None:
        await self.detach()
        self._origin.close()

"""The lock-service types: what a lock service answers, and the service interface.

``LockClient`` and ``AsyncLockClient`` drive an *executor* (``MemoryExecutor``,
``SQLiteExecutor``, ``PostgresExecutor``, ``RedisExecutor``, ``EtcdExecutor``): the core
speaks that backend's protocol itself and the executor only runs its requests. A
:class:`LockService` of one's own is not driven by a client (it raises ``TypeError`` naming
the executors): the core no longer emits acquire/renew/release commands for a host to
answer. The types stay importable: :class:`LockStatus` is what ``status(name)`` returns, and
:class:`Granted` / :class:`HeldByOther` describe a service's answer.

``token`` is the lease's ownership token (32 lowercase hex chars, unique per lease); a
service stores it with the lock and compares it on renew/release. Acquire is idempotent for
the same token (a retried acquire whose answer was lost finds its own grant and returns the
same fencing token). Fencing tokens of successive grants of one name strictly increase and
are never reset.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

__all__ = ["Granted", "HeldByOther", "LockStatus", "LockService", "AsyncLockService", "to_async"]


@dataclass(frozen=True)
class Granted:
    """The lock was granted (or, same token, was already ours: TTL refreshed)."""

    fencing_token: int
    ttl_ms: int
    backend_data: bytes = b""


@dataclass(frozen=True)
class HeldByOther:
    """Someone else holds the lock; ``retry_after_ms`` is its remaining TTL if known."""

    retry_after_ms: int | None = None


@dataclass(frozen=True)
class LockStatus:
    """What a backend says about one name right now (advisory: it can change at once).

    Returned by the ``status(name)`` method of the services that can inspect a lock (SQLite,
    Redis, memory); ``leasehold status`` prints it. The holder's pid, host and the time it has
    held the lock are known where the backend records them (SQLite, memory; not Redis) and are
    ``None`` otherwise. They are metadata for humans and are left out of equality.
    """

    name: str
    held: bool
    fencing_token: int | None  # the holder's token while held
    remaining_ttl_ms: int | None  # while held
    holder_pid: int | None  # pid of the process that acquired it, while held
    last_fencing_token: int | None  # highest token ever granted for the name (None: never)
    holder_host: str | None = field(default=None, compare=False)  # host name of that process
    held_for_ms: int | None = field(default=None, compare=False)  # since the grant, while held

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LockService(abc.ABC):
    """The interface of a synchronous lock service (a client drives executors, not these:
    see the module doc)."""

    notifications: bool = True
    """True when ``watch`` delivers release notifications (→ ``Config.notifications``)."""

    @abc.abstractmethod
    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        """Try to take ``name`` for ``token`` for ``ttl_ms`` milliseconds."""

    @abc.abstractmethod
    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        """Extend our hold to ``ttl_ms`` from now; ``False`` if we no longer own it."""

    @abc.abstractmethod
    def release(self, name: str, token: str, backend_data: bytes) -> bool:
        """Delete our hold and notify watchers; ``False`` if we did not own it."""

    def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        """Start delivering release notifications of ``name`` to ``on_released`` (default: none)."""

    def unwatch(self, name: str) -> None:
        """Stop delivering release notifications of ``name``."""

    def close(self) -> None:
        """Release connections and threads owned by the service."""


class AsyncLockService(abc.ABC):
    """The asyncio twin of :class:`LockService`."""

    notifications: bool = True

    @abc.abstractmethod
    async def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther: ...

    @abc.abstractmethod
    async def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool: ...

    @abc.abstractmethod
    async def release(self, name: str, token: str, backend_data: bytes) -> bool: ...

    async def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        """Start delivering release notifications (``on_released`` is thread-safe)."""

    async def unwatch(self, name: str) -> None:
        """Stop delivering release notifications of ``name``."""

    async def close(self) -> None:
        """Release connections owned by the service."""


class _SyncToAsync(AsyncLockService):
    """Runs a synchronous service's calls in worker threads (``asyncio.to_thread``)."""

    def __init__(self, inner: LockService) -> None:
        self.inner = inner
        self.notifications = inner.notifications

    async def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        return await asyncio.to_thread(self.inner.acquire, name, token, ttl_ms)

    async def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        return await asyncio.to_thread(self.inner.renew, name, token, ttl_ms, backend_data)

    async def release(self, name: str, token: str, backend_data: bytes) -> bool:
        return await asyncio.to_thread(self.inner.release, name, token, backend_data)

    async def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        await asyncio.to_thread(self.inner.watch, name, on_released)

    async def unwatch(self, name: str) -> None:
        await asyncio.to_thread(self.inner.unwatch, name)

    async def close(self) -> None:
        await asyncio.to_thread(self.inner.close)


def to_async(service: LockService | AsyncLockService) -> AsyncLockService:
    """Adapt a synchronous service to the asyncio interface (an async one is returned as is)."""
    if isinstance(service, AsyncLockService):
        return service
    if not isinstance(service, LockService):
        raise TypeError(f"expected a LockService or AsyncLockService, not {type(service).__name__}")
    return _SyncToAsync(service)

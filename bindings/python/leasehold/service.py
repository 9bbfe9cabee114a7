"""The backend interface: what a lock service must do for the core's commands.

A service maps the core's three commands (acquire, renew, release) and the watch onto a real
store. It never decides timing: the core does. ``LockClient`` calls a :class:`LockService`
from a small IO thread pool (so calls may block, and several may run concurrently);
``AsyncLockClient`` awaits an :class:`AsyncLockService` on its event loop.

**Any exception** raised by ``acquire``/``renew``/``release`` is a *transport error* for the
core (it is logged and retried by the core's policy); it is never a grant.

``token`` is the lease's ownership token (32 lowercase hex chars, unique per lease); the
service must store it with the lock and compare it on renew/release. Acquire is idempotent
for the same token (a retried acquire whose answer was lost finds its own grant and returns
the same fencing token). Fencing tokens of successive grants of one name strictly increase
and are never reset.
"""

from __future__ import annotations

import abc
import asyncio
import threading
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
    """A synchronous lock service; called from the driver's IO pool, may block.

    Optional capability (not defined here, so a service without it keeps the plain path):
    ``send_acquire(name, token, ttl_ms)`` sends what ``acquire`` would and returns at once
    with a callable that reads the reply and returns (or raises) what ``acquire`` would, or
    ``None`` when it sent nothing. ``LockClient`` uses it when a thread other than the
    waiting one reads a wake-up (see ``watch_waiter``): that thread sends the waiter's
    attempt, and the waiter only reads the reply, so the hand-off between the two threads
    overlaps the round trip. The client calls the returned callable exactly once (from any
    thread; also when the waiter has left meanwhile); a failed read may re-send, since
    acquire is idempotent for a token.

    Optional capability ``grants_on_release`` (a true attribute; Redis protocol 3): a release
    grants the lock to the oldest queued waiting lease itself and tells that lease's client
    with a grant notice. ``LockClient`` then passes each attempt's request id as a fourth
    argument of ``acquire`` (and ``send_acquire``), the *tag* a queued attempt is granted
    under, and accepts ``on_wake(name, notice)`` from ``watch_waiter`` (``notice`` with
    ``tag``, ``fencing_token``, ``ttl_ms``, ``token`` and ``name``). The core dates such a grant
    from the send time of the attempt it names; a grant no lease of the client owns is
    released by the client, and one no client takes must be released by the service.
    """

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

    wakes_one_waiter: bool = False
    """True when the service itself picks one waiting client per release: the client then
    calls ``watch_waiter``/``unwatch_waiter`` for its waiters and ``watch`` only for
    ``on_release`` subscribers. Otherwise waiters use ``watch`` (every release wakes them)."""

    def watch_waiter(self, name: str, on_wake: Callable[[str], object]) -> None:
        """The client has waiters for ``name``; call ``on_wake(name)`` when one should re-try.
        ``on_wake`` returns ``False`` when no waiter took the wake-up (the service may then
        pass it on to another client)."""

        def deliver(n: str) -> None:
            on_wake(n)

        self.watch(name, deliver)

    def unwatch_waiter(self, name: str) -> None:
        """The client has no waiter for ``name`` any more."""
        self.unwatch(name)

    def park(self, ready: threading.Event, timeout: float) -> bool:
        """Block the calling thread, an ``acquire()`` caller waiting for its turn, until
        ``ready`` is set or ``timeout`` seconds pass; returns ``ready.is_set()``.

        A service with a notification connection may serve it on this thread meanwhile: the
        wake-up is then read, handled and acted on by the waiter itself, without a hand-off
        between threads (0.1–0.2 ms of a CPython handoff, measured). Whoever else sets
        ``ready`` calls :meth:`unpark` afterwards; the thread calls :meth:`end_park` once it
        stops waiting."""
        return ready.wait(timeout)

    def unpark(self) -> None:
        """Another thread set a parked thread's ``ready`` (see :meth:`park`)."""

    def end_park(self) -> None:
        """The calling thread will not park again for now (see :meth:`park`)."""

    def close(self) -> None:
        """Release connections and threads owned by the service."""


class AsyncLockService(abc.ABC):
    """The asyncio twin of :class:`LockService` (used by ``AsyncLockClient``)."""

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

    wakes_one_waiter: bool = False
    """See :attr:`LockService.wakes_one_waiter`."""

    async def watch_waiter(self, name: str, on_wake: Callable[[str], object]) -> None:
        """The client has waiters for ``name``. ``on_wake`` is thread-safe; called on the
        client's loop it returns ``False`` when no waiter took the wake-up (pass it on), from
        another thread ``None`` (the client cannot tell at once)."""

        def deliver(n: str) -> None:
            on_wake(n)

        await self.watch(name, deliver)

    async def unwatch_waiter(self, name: str) -> None:
        """The client has no waiter for ``name`` any more."""
        await self.unwatch(name)

    async def close(self) -> None:
        """Release connections owned by the service."""


class _SyncToAsync(AsyncLockService):
    """Runs a synchronous service's calls in worker threads (``asyncio.to_thread``)."""

    def __init__(self, inner: LockService) -> None:
        self.inner = inner
        self.notifications = inner.notifications
        self.wakes_one_waiter = inner.wakes_one_waiter

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

    async def watch_waiter(self, name: str, on_wake: Callable[[str], object]) -> None:
        await asyncio.to_thread(self.inner.watch_waiter, name, on_wake)

    async def unwatch_waiter(self, name: str) -> None:
        await asyncio.to_thread(self.inner.unwatch_waiter, name)

    async def close(self) -> None:
        await asyncio.to_thread(self.inner.close)


def to_async(service: LockService | AsyncLockService) -> AsyncLockService:
    """Adapt a synchronous service for ``AsyncLockClient`` (an async one is returned as is)."""
    if isinstance(service, AsyncLockService):
        return service
    if not isinstance(service, LockService):
        raise TypeError(f"expected a LockService or AsyncLockService, not {type(service).__name__}")
    return _SyncToAsync(service)

"""An in-process reference lock service with fault switches.

* :class:`MemoryStore` is the "server": locks, fencing counters (never reset) and its own
  clock (``store.step_clock()`` jumps it forward, expiring leases on the server side only).
* :class:`MemoryLockService` is one *connection* to a store, with its own fault switches,
  so a test can partition one client while the others keep working. Several clients
  contend for the same locks by each using their own service on one shared store::

      store = MemoryStore()
      a = LockClient(MemoryLockService(store))
      b = LockClient(MemoryLockService(store))

Semantics match the other backends: acquire is idempotent for the same token (same fencing
token, TTL refreshed) and returns the holder's remaining TTL otherwise; renew and release
compare the token first; release notifies every connection watching the name.

Fault switches (attributes of a service, change them at any time):

* ``partitioned`` – every call raises ``ConnectionError`` before reaching the store;
* ``drop_requests`` – same, but counted separately (a lost request);
* ``drop_responses`` – the call is applied, then ``ConnectionError`` (a lost answer);
  :meth:`MemoryLockService.drop_next_responses` does that for the next *n* calls only;
* ``reject_renewals`` – renew answers ``False`` (the service refuses: the lease is lost);
* ``reject_acquires`` – acquire answers "held by another";
* ``delay`` – seconds every call takes, measured on the store's clock (with a
  :class:`~leasehold.testing.FakeClock` the call waits until the test advances it);
* :meth:`MemoryLockService.hang` / :meth:`MemoryLockService.unhang` – calls block until
  ``unhang()`` (or ``close()``): a hung backend.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable

from .._clock import resolve_clock
from ..service import Granted, HeldByOther, LockService, LockStatus

__all__ = ["MemoryStore", "MemoryLockService", "LockRecord"]

_HOST = socket.gethostname()


@dataclass(frozen=True)
class LockRecord:
    """The store's view of one held lock, with who acquired it and when (for ``status``)."""

    name: str
    token: str
    fencing_token: int
    expires_ns: int
    pid: int = 0
    host: str = ""
    since_ns: int = 0


class MemoryStore:
    """The shared state of memory lock services ("the server")."""

    def __init__(self, *, clock: Any = None) -> None:
        self._now_fn, self._clock_sub, self._real_clock = resolve_clock(clock)
        self.clock = clock
        self._offset_ns = 0
        self._lock = threading.Lock()
        self._locks: dict[str, LockRecord] = {}
        self._fences: dict[str, int] = {}
        self._services: "weakref.WeakSet[MemoryLockService]" = weakref.WeakSet()
        self.grants: list[tuple[str, str, int]] = []
        """Every new grant, in order: (name, token, fencing_token)."""

    # -- clock ----------------------------------------------------------------------------------
    def now_ns(self) -> int:
        """The store's clock (its own clock plus every ``step_clock``)."""
        return int(self._now_fn()) + self._offset_ns

    def step_clock(self, seconds: float) -> None:
        """Jump the store's clock forward (a server clock step): leases expire earlier."""
        if seconds < 0:
            raise ValueError("the store's clock only steps forward")
        with self._lock:
            self._offset_ns += int(seconds * 1e9)

    def wait(self, seconds: float, abort: threading.Event) -> None:
        """Let ``seconds`` pass on the store's clock (fake clocks: until advanced)."""
        if seconds <= 0:
            return
        if self._real_clock or self.clock is None:
            abort.wait(seconds)
            return
        end = self.now_ns() + int(seconds * 1e9)
        wake = threading.Event()
        unsub = self._clock_sub.subscribe(wake.set) if self._clock_sub is not None else None
        try:
            while self.now_ns() < end and not abort.is_set():
                wake.wait(0.01 if unsub is None else 0.5)
                wake.clear()
        finally:
            if unsub is not None:
                unsub()

    # -- inspection ------------------------------------------------------------------------------
    def holder(self, name: str) -> LockRecord | None:
        """The live holder of ``name``, or ``None`` (free or expired)."""
        with self._lock:
            rec = self._locks.get(name)
            if rec is None or rec.expires_ns <= self.now_ns():
                return None
            return rec

    def last_fence(self, name: str) -> int:
        """The last fencing token granted for ``name`` (0 if never)."""
        with self._lock:
            return self._fences.get(name, 0)

    def status(self, name: str) -> LockStatus:
        """What the store says about ``name`` right now, holder pid, host and time included."""
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        with self._lock:
            now = self.now_ns()
            rec = self._locks.get(name)
            last = self._fences.get(name)
        if rec is None or rec.expires_ns <= now:
            return LockStatus(name, False, None, None, None, last)
        return LockStatus(
            name, True, rec.fencing_token, max(1, (rec.expires_ns - now + 999_999) // 1_000_000),
            rec.pid or None, last, holder_host=rec.host or None,
            held_for_ms=max(0, (now - rec.since_ns) // 1_000_000),
        )

    # -- operations (called by services) -------------------------------------------------------
    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        with self._lock:
            now = self.now_ns()
            rec = self._locks.get(name)
            if rec is not None and rec.expires_ns > now:
                if rec.token == token:
                    self._locks[name] = replace(rec, expires_ns=now + ttl_ms * 1_000_000)
                    return Granted(rec.fencing_token, ttl_ms)
                return HeldByOther(max(1, (rec.expires_ns - now + 999_999) // 1_000_000))
            fence = self._fences.get(name, 0) + 1
            self._fences[name] = fence
            self._locks[name] = LockRecord(
                name, token, fence, now + ttl_ms * 1_000_000, os.getpid(), _HOST, now
            )
            self.grants.append((name, token, fence))
            return Granted(fence, ttl_ms)

    def renew(self, name: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ns()
            rec = self._locks.get(name)
            if rec is None or rec.token != token or rec.expires_ns <= now:
                return False
            self._locks[name] = replace(rec, expires_ns=now + ttl_ms * 1_000_000)
            return True

    def release(self, name: str, token: str) -> bool:
        with self._lock:
            rec = self._locks.get(name)
            if rec is None or rec.token != token:
                return False
            del self._locks[name]
            services = list(self._services)
        for s in services:
            s._deliver(name)
        return True


class MemoryLockService(LockService):
    """One connection to a :class:`MemoryStore`, with fault switches (see the module doc).

    :param store: the shared store; a private one (with ``clock``) when omitted
    :param clock: the clock of the private store (ignored when ``store`` is given)
    :param notifications: deliver release notifications to watchers
    """

    def __init__(self, store: MemoryStore | None = None, *, clock: Any = None, notifications: bool = True) -> None:
        self.store = store if store is not None else MemoryStore(clock=clock)
        self.notifications = notifications
        self.partitioned = False
        self.drop_requests = False
        self.drop_responses = False
        self.reject_renewals = False
        self.reject_acquires = False
        self.delay = 0.0
        self._drop_next = 0
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        self._wlock = threading.Lock()
        self._watchers: dict[str, Callable[[str], None]] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        """Calls that reached this service, by operation."""
        self.called: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)
        """``called[op]`` is set once ``op`` was called (tests wait on it instead of sleeping)."""
        self.tokens: list[str] = []
        """Ownership tokens seen in acquire calls, in order."""
        self.store._services.add(self)

    # -- fault switches ---------------------------------------------------------------------------
    def partition(self) -> None:
        """Cut this connection off (every call fails with ``ConnectionError``)."""
        self.partitioned = True

    def heal(self) -> None:
        """Undo every fault switch (and unhang)."""
        self.partitioned = self.drop_requests = self.drop_responses = False
        self.reject_renewals = self.reject_acquires = False
        self.delay = 0.0
        self._drop_next = 0
        self._open.set()

    def drop_next_responses(self, n: int = 1) -> None:
        """Apply the next ``n`` calls, then lose their answers (``ConnectionError``)."""
        with self._wlock:
            self._drop_next = n

    def hang(self) -> None:
        """Make every call block until :meth:`unhang` or :meth:`close` (a hung backend)."""
        self._open.clear()

    def unhang(self) -> None:
        self._open.set()

    def step_clock(self, seconds: float) -> None:
        """Jump the store's clock forward (see :meth:`MemoryStore.step_clock`)."""
        self.store.step_clock(seconds)

    # -- LockService -------------------------------------------------------------------------------
    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        self.called[op].set()
        if self._closed.is_set():
            raise ConnectionError("memory service closed")
        while not self._open.is_set():
            if self._closed.is_set():
                raise ConnectionError("memory service closed")
            self._open.wait(0.5)
        if self._closed.is_set():
            raise ConnectionError("memory service closed")
        if self.delay:
            self.store.wait(self.delay, self._closed)
        if self.partitioned:
            raise ConnectionError(f"memory service partitioned ({op})")
        if self.drop_requests:
            raise ConnectionError(f"request dropped ({op})")

    def _exit(self, op: str) -> None:
        if self.drop_responses:
            raise ConnectionError(f"response dropped ({op})")
        with self._wlock:
            drop = self._drop_next > 0
            if drop:
                self._drop_next -= 1
        if drop:
            raise ConnectionError(f"response dropped ({op})")

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        self._enter("acquire")
        self.tokens.append(token)
        if self.reject_acquires:
            return HeldByOther(None)
        r = self.store.acquire(name, token, ttl_ms)
        self._exit("acquire")
        return r

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        self._enter("renew")
        if self.reject_renewals:
            return False
        r = self.store.renew(name, token, ttl_ms)
        self._exit("renew")
        return r

    def release(self, name: str, token: str, backend_data: bytes) -> bool:
        self._enter("release")
        r = self.store.release(name, token)
        self._exit("release")
        return r

    def status(self, name: str) -> LockStatus:
        """The store's view of ``name`` (see :meth:`MemoryStore.status`); no fault switch applies."""
        return self.store.status(name)

    def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        with self._wlock:
            self._watchers[name] = on_released

    def unwatch(self, name: str) -> None:
        with self._wlock:
            self._watchers.pop(name, None)

    def close(self) -> None:
        """Fail every later call and wake hung ones. Idempotent."""
        self._closed.set()
        self._open.set()

    def _deliver(self, name: str) -> None:
        if not self.notifications or self.partitioned or self._closed.is_set():
            return
        with self._wlock:
            cb = self._watchers.get(name)
        if cb is not None:
            cb(name)

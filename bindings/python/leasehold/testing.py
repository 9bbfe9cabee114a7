"""Tools to test code that uses leasehold, without a server and without sleeping.

* :class:`FakeClock` – a monotonic clock that only moves when you :meth:`~FakeClock.advance`
  it (it never sleeps). Pass it to ``LockClient(clock=...)`` and ``MemoryService(clock=...)``.
* :class:`MemoryExecutor` / :class:`MemoryService` – the fault-injecting memory backend, on
  the core's reference service (partition, drop, reject, delay, hang, server clock step);
  also under their first names ``MemoryLockService`` / ``MemoryStore``.
* :func:`pause_driver` – freeze a client's driver (a GC pause, a stopped VM): no renewal,
  no loss detection, no result processing until the block ends.
* :func:`settle` – advance a fake clock in steps, letting the clients react after each.

Example: the lock is lost when renewals are rejected::

    clock = FakeClock()
    store = MemoryService(clock=clock)
    svc = MemoryExecutor(store)
    with LockClient(svc, clock=clock) as client:
        h = client.acquire("job", ttl=10)
        svc.reject_renewals = True
        settle(clock, [client], seconds=10)
        assert h.lost.is_set()
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .backends.memory import LockRecord, MemoryExecutor, MemoryLockService, MemoryService, MemoryStore

if TYPE_CHECKING:
    from .client import LockClient

__all__ = [
    "FakeClock",
    "MemoryService",
    "MemoryExecutor",
    "MemoryLockService",
    "MemoryStore",
    "LockRecord",
    "FaultyMemoryService",
    "pause_driver",
    "settle",
]

FaultyMemoryService = MemoryExecutor
"""Alias: the memory executor is the fault-injecting one."""


class FakeClock:
    """A manual monotonic clock (integer nanoseconds). Thread-safe; never sleeps.

    :param start: initial reading in seconds (large by default, like a real uptime)
    """

    def __init__(self, start: float = 1_000.0) -> None:
        if start < 0:
            raise ValueError("start must be >= 0")
        self._ns = int(start * 1e9)
        self._lock = threading.Lock()
        self._subs: dict[int, Callable[[], None]] = {}
        self._next = 0

    def monotonic_ns(self) -> int:
        with self._lock:
            return self._ns

    def monotonic(self) -> float:
        return self.monotonic_ns() / 1e9

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0) and wake every subscriber."""
        if seconds < 0:
            raise ValueError("a monotonic clock never goes backwards")
        self.advance_ns(int(seconds * 1e9))

    def advance_ns(self, ns: int) -> None:
        if ns < 0:
            raise ValueError("a monotonic clock never goes backwards")
        with self._lock:
            self._ns += ns
            subs = list(self._subs.values())
        for cb in subs:  # outside the lock: subscribers may read the clock
            cb()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every advance; returns the unsubscribe function."""
        with self._lock:
            key = self._next
            self._next += 1
            self._subs[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subs.pop(key, None)

        return unsubscribe

    def __repr__(self) -> str:
        return f"<FakeClock {self.monotonic():.6f}s>"


@contextlib.contextmanager
def pause_driver(*clients: "LockClient") -> Iterator[None]:
    """Freeze the drivers of ``clients`` for the duration of the block (a process pause).

    While paused a client neither renews nor notices the passing of time; backend answers
    queue up. On exit the driver wakes and, like a real process after a pause, first finds
    out what expired.
    """
    for c in clients:
        c._set_paused(True)
    try:
        yield
    finally:
        for c in clients:
            c._set_paused(False)


def settle(
    clock: FakeClock,
    clients: Iterable["LockClient"],
    seconds: float,
    step: float | None = None,
    idle_timeout: float = 10.0,
) -> None:
    """Advance ``clock`` by ``seconds`` in steps (default: 20 steps), waiting after each step
    until every client in ``clients`` is idle (see ``LockClient.wait_idle``).

    Raises ``TimeoutError`` if a client does not become idle (a hung backend, a paused driver).
    """
    cl = list(clients)
    step = seconds / 20 if step is None else step
    if step <= 0:
        raise ValueError("step must be > 0")
    for c in cl:
        if not c.wait_idle(idle_timeout):
            raise TimeoutError(f"{c!r} did not become idle")
    left = seconds
    while left > 1e-12:
        d = min(step, left)
        clock.advance(d)
        left -= d
        for c in cl:
            if not c.wait_idle(idle_timeout):
                raise TimeoutError(f"{c!r} did not become idle")

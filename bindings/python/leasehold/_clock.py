"""Clock plumbing shared by the clients (real monotonic clock or an injected one)."""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, runtime_checkable

__all__ = ["Clock", "SubscribableClock", "resolve_clock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``monotonic_ns()``; ``leasehold.testing.FakeClock`` is one."""

    def monotonic_ns(self) -> int: ...


@runtime_checkable
class SubscribableClock(Clock, Protocol):
    """A clock that tells listeners when it moves (so drivers need not poll it)."""

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]: ...


def resolve_clock(clock: Any) -> tuple[Callable[[], int], SubscribableClock | None, bool]:
    """Return (now_ns function, subscribable clock or None, is_real_clock)."""
    if clock is None:
        return time.monotonic_ns, None, True
    if isinstance(clock, Clock):
        sub = clock if isinstance(clock, SubscribableClock) else None
        return clock.monotonic_ns, sub, False
    if callable(clock):
        return clock, None, False
    raise TypeError("clock must have monotonic_ns() or be a callable returning nanoseconds")

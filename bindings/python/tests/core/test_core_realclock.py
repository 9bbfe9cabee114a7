"""The default (real monotonic) clock: the driver sleeps until the core's deadlines.

No timing assertions: each test waits (bounded) for an event that must happen.
"""

from __future__ import annotations

import time

from leasehold import LockClient
from leasehold.testing import MemoryLockService


def _until(condition, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_real_clock_renews_then_detects_partition() -> None:
    svc = MemoryLockService()
    with LockClient(svc) as c:
        h = c.acquire("real", ttl=3.0)  # generous: a loaded machine must not lose it early
        assert _until(lambda: c.counters().renewals_ok >= 2), "the driver never renewed on the real clock"
        assert svc.store.holder("real") is not None
        svc.partition()
        assert h.lost.wait(30), "loss never detected on the real clock"
        assert h.lost_reason in ("fail_budget", "expired")
        assert not h.is_held()
        svc.heal()

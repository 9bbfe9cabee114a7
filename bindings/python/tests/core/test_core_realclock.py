"""The default (real monotonic) clock: the driver sleeps until the core's deadlines.

No timing assertions: each test waits (bounded) for an event that must happen.
"""

from __future__ import annotations

import threading

from leasehold import LockClient
from leasehold.testing import MemoryLockService


class CountingService(MemoryLockService):
    """Sets ``renewed`` after ``n`` successful renewals."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.renewals = 0
        self.renewed = threading.Event()

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        ok = super().renew(name, token, ttl_ms, backend_data)
        if ok:
            self.renewals += 1
            if self.renewals >= self.n:
                self.renewed.set()
        return ok


def test_real_clock_renews_then_detects_partition() -> None:
    svc = CountingService(n=2)
    with LockClient(svc) as c:
        h = c.acquire("real", ttl=3.0)  # generous: a loaded machine must not lose it early
        assert svc.renewed.wait(30), "the driver never renewed on the real clock"
        assert svc.store.holder("real") is not None
        svc.partition()
        assert h.lost.wait(30), "loss never detected on the real clock"
        assert h.lost_reason in ("fail_budget", "expired")
        assert not h.is_held()
        svc.heal()

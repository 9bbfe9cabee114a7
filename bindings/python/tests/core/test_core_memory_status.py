"""The memory service reports who holds a lock (pid, host, time held), as SQLite does."""

from __future__ import annotations

import os
import socket

from leasehold.backends.memory import MemoryLockService, MemoryStore
from leasehold.service import LockStatus
from leasehold.testing import FakeClock

T1, T2 = "a" * 32, "b" * 32


def test_memory_status_names_the_holder():
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    svc = MemoryLockService(store)
    assert svc.status("n") == LockStatus("n", False, None, None, None, None)
    svc.acquire("n", T1, 10_000)
    clock.advance(2)
    assert svc.renew("n", T1, 10_000, b"")  # renewing keeps "since"
    clock.advance(1)
    st = svc.status("n")
    assert st == LockStatus("n", True, 1, 9_000, os.getpid(), 1)
    assert st.holder_host == socket.gethostname() and st.held_for_ms == 3_000
    assert store.status("n") == st

    assert svc.release("n", T1, b"")
    svc.acquire("n", T2, 10_000)
    assert svc.status("n").held_for_ms == 0
    clock.advance(11)
    expired = svc.status("n")
    assert expired == LockStatus("n", False, None, None, None, 2)
    assert expired.holder_host is None

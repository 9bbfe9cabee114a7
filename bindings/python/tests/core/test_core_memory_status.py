"""The memory service reports who holds a lock (pid, host, time held), as SQLite does."""

from __future__ import annotations

import os
import socket

import pytest

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


def test_memory_switches_are_the_core_services():
    """The switches reach the core's service: each connection has its own, and a release
    notification is delivered even when the releaser's answer is lost."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    a, b = MemoryLockService(store), MemoryLockService(store)
    seen: list[str] = []
    b.watch("n", seen.append)
    assert a.acquire("n", T1, 1_000).fencing_token == 1
    a.reject_releases = True
    assert not a.release("n", T1, b"") and store.holder("n") is not None and seen == []
    a.reject_releases = False
    a.drop_next_responses(1)
    with pytest.raises(ConnectionError, match="response dropped"):
        a.release("n", T1, b"")
    assert store.holder("n") is None and seen == ["n"]
    # A grant that ran out on the service cannot be released by its old holder.
    assert b.acquire("n", T2, 1_000).fencing_token == 2
    clock.advance(1.5)
    assert not b.release("n", T2, b"")
    assert store.last_fence("n") == 2 and [f for (_n, _t, f) in store.grants] == [1, 2]

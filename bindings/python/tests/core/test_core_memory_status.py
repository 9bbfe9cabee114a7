"""The memory service reports who holds a lock (pid, host, time held), as SQLite does."""

from __future__ import annotations

import os
import socket
import threading

from leasehold import LockClient
from leasehold.backends.memory import MemoryLockService, MemoryStore
from leasehold.service import LockStatus
from leasehold.testing import FakeClock, settle


def test_memory_status_names_the_holder():
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    svc = MemoryLockService(store)
    assert svc.status("n") == LockStatus("n", False, None, None, None, None)
    with LockClient(svc, clock=clock) as c, LockClient(MemoryLockService(store), clock=clock) as other:
        h = c.acquire("n", ttl=10, auto_renew=False)
        clock.advance(2)
        h.renew()  # renewing keeps "since"
        clock.advance(1)
        st = svc.status("n")
        assert st == LockStatus("n", True, 1, 9_000, os.getpid(), 1)
        assert st.holder_host == socket.gethostname() and st.held_for_ms == 3_000
        assert store.status("n") == st

        assert h.release() == "released"
        other.acquire("n", ttl=10, auto_renew=False)
        assert svc.status("n").held_for_ms == 0
        settle(clock, [c, other], seconds=11)
        expired = svc.status("n")
        assert expired == LockStatus("n", False, None, None, None, 2)
        assert expired.holder_host is None


def test_memory_switches_are_the_core_services():
    """The switches reach the core's service: each connection has its own, and a release
    notification is delivered even when the releaser's answer is lost."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ea, eb = MemoryLockService(store), MemoryLockService(store)
    with LockClient(ea, clock=clock) as a, LockClient(eb, clock=clock) as b:
        ha = a.acquire("n", ttl=1)
        assert ha.fencing_token == 1
        ea.reject_releases = True
        assert ha.release() == "not_owner" and store.holder("n") is not None
        ea.reject_releases = False
        assert not eb.reject_releases  # the other connection's switches are its own
        settle(clock, [a, b], seconds=1.5)  # the refused grant runs out on the service
        ha = a.acquire("n", ttl=30)
        got: list[object] = []  # a waiter on b, woken by a's release only (the clock stands still)
        t = threading.Thread(target=lambda: got.append(b.acquire("n", ttl=30, wait=60)))
        t.start()
        assert b.wait_idle()
        ea.drop_next_responses(1)
        ha.release(timeout=0)  # applied on the service, its answer lost
        t.join(10)
        assert not t.is_alive() and getattr(got[0], "fencing_token") == 3
        rec = store.holder("n")
        assert rec is not None and rec.fencing_token == 3
        # A grant that ran out on the service cannot be released by its old holder.
        store.step_clock(31)
        assert getattr(got[0], "release")() == "not_owner"
        assert store.last_fence("n") == 3 and store.stats()["grants"] == 3

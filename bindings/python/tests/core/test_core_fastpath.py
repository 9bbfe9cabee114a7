"""LockClient's inline fast path and driver wake-ups (memory service, fake clock).

The fast path runs the command of an application's own acquire()/release() on the calling
thread when the service declares a bounded ``call_timeout`` (or ``inline_io=True``); while an
acquire() caller waits, its lease's later Acquire commands (retries, wake-ups by a
notification) are handed to it; every other command (renewals, cleanup releases) stays on the
IO pool.
"""

from __future__ import annotations

import threading
import time

import pytest

from leasehold import LockClient
from leasehold.client import service_call_bound
from leasehold.service import Granted, HeldByOther
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore, settle


class Recording(MemoryLockService):
    """Records which thread ran each acquire/release call."""

    def __init__(self, store: MemoryStore, call_timeout: object = None) -> None:
        super().__init__(store)
        if call_timeout is not None:
            self.call_timeout = call_timeout
        self.log: list[tuple[str, str]] = []
        self.log_cond = threading.Condition()

    def _record(self, op: str) -> None:
        with self.log_cond:
            self.log.append((op, threading.current_thread().name))
            self.log_cond.notify_all()

    def wait_calls(self, n: int, timeout: float = 10.0) -> bool:
        with self.log_cond:
            return self.log_cond.wait_for(lambda: len(self.log) >= n, timeout)

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        self._record("acquire")
        return super().acquire(name, token, ttl_ms)

    def release(self, name: str, token: str, backend_data: bytes) -> bool:
        self._record("release")
        return super().release(name, token, backend_data)


def threads_of(service: Recording, op: str) -> list[str]:
    return [t for o, t in service.log if o == op]


def wait_parked(c: LockClient, timeout: float = 10.0) -> bool:
    """Wait until an acquire() caller of ``c`` is parked as its lease's runner (a command the
    core issues before that, e.g. the subscription's re-check, may still run on the pool)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with c._mu:
            if c._parked:
                return True
        time.sleep(0.001)
    return False


def test_service_call_bound_reads_a_positive_call_timeout() -> None:
    class S:
        pass

    s = S()
    assert service_call_bound(s) is None
    for bad in (None, True, 0, -1.0, float("inf"), float("nan"), "2"):
        s.call_timeout = bad  # type: ignore[attr-defined]
        assert service_call_bound(s) is None, bad
    s.call_timeout = 2  # type: ignore[attr-defined]
    assert service_call_bound(s) == 2.0


def test_uncontended_cycle_is_two_calls_on_the_calling_thread(make_client, store: MemoryStore) -> None:
    s = Recording(store, call_timeout=5.0)
    c = make_client(s)
    me = threading.current_thread().name
    for _ in range(20):
        h = c.acquire("job", ttl=10)
        assert h.state == "held" and store.holder("job") is not None
        h.release()
        assert h.state == "released"
        assert store.holder("job") is None, "release() returns once the service answered"
    assert s.log == [("acquire", me), ("release", me)] * 20
    k = c.counters()
    assert (k.acquires_sent, k.grants, k.releases_sent, k.stale_results) == (20, 20, 20, 0)
    assert c.wait_idle()
    assert c.counters().pending_cleanups == 0


@pytest.mark.parametrize("call_timeout,inline_io,inline", [(None, None, False), (5.0, False, False), (None, True, True)])
def test_the_fast_path_needs_a_call_bound_or_an_explicit_opt_in(
    make_client, store: MemoryStore, call_timeout: float | None, inline_io: bool | None, inline: bool
) -> None:
    s = Recording(store, call_timeout=call_timeout)
    c = make_client(s, inline_io=inline_io)
    h = c.acquire("job", ttl=10)
    h.release()
    assert c.wait_idle()
    me = threading.current_thread().name
    assert len(s.log) == 2
    for _op, t in s.log:
        assert (t == me) is inline, s.log
        if not inline:
            assert t.startswith("leasehold-io")


def test_inline_io_must_be_a_bool(store: MemoryStore) -> None:
    with pytest.raises(TypeError):
        LockClient(MemoryLockService(store), inline_io=1)  # type: ignore[arg-type]


def test_the_driver_is_not_woken_by_every_cycle(make_client, store: MemoryStore) -> None:
    c = make_client(Recording(store, call_timeout=5.0))
    c.acquire("warm", ttl=10).release()
    assert c.wait_idle()
    before = c._wakeups
    for _ in range(50):
        c.acquire("job", ttl=10).release()
    # The clock is frozen, so no deadline passes: a driver woken by every drain would have
    # woken >= 100 times; it is only woken when its deadline moves earlier.
    assert c._wakeups - before <= 5, c._wakeups - before


def test_a_woken_waiter_retries_on_its_own_thread(make_client, clock: FakeClock, store: MemoryStore) -> None:
    holder = make_client()
    h1 = holder.acquire("x", ttl=10)
    s = Recording(store, call_timeout=5.0)
    c = make_client(s)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10, wait=60)), name="app")
    t.start()
    assert s.wait_calls(1)  # the first attempt (HeldByOther), on the application thread
    assert c.wait_idle() and wait_parked(c) and c.wait_idle()
    before = len(threads_of(s, "acquire"))
    assert threads_of(s, "acquire")[0] == "app"
    h1.release()  # the notification wakes the waiter: its retry is handed to the parked caller
    t.join(10)
    assert not t.is_alive() and len(got) == 1
    h2 = got[0]
    assert getattr(h2, "state") == "held"
    acq = threads_of(s, "acquire")[before:]
    assert acq and set(acq) == {"app"}, acq
    getattr(h2, "release")()


def test_an_inline_transport_error_is_retried_by_the_waiting_caller(
    make_client, clock: FakeClock, store: MemoryStore
) -> None:
    s = Recording(store, call_timeout=5.0)
    s.drop_next_responses(1)  # the grant happens in the store, its answer is lost
    c = make_client(s)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10, wait=30)), name="app")
    t.start()
    assert s.wait_calls(1) and wait_parked(c)
    while t.is_alive():  # let the core's backoff pass (fake time)
        settle(clock, [c], seconds=0.05, step=0.01)
        t.join(0.01)
    assert len(got) == 1
    h = got[0]
    assert getattr(h, "state") == "held"
    acq = threads_of(s, "acquire")
    assert acq == ["app", "app"], acq
    rec = store.holder("x")
    assert rec is not None and rec.fencing_token == getattr(h, "fencing_token"), "same token: idempotent retry"
    getattr(h, "release")()
    assert store.holder("x") is None


def test_a_shorter_explicit_release_timeout_takes_the_pool(make_client, store: MemoryStore) -> None:
    s = Recording(store, call_timeout=5.0)
    c = make_client(s)
    h = c.acquire("x", ttl=10)
    h.release(timeout=0.0)  # may not wait for a 5 s call: the pool sends it
    assert c.wait_idle()
    assert store.holder("x") is None
    assert threads_of(s, "release")[0].startswith("leasehold-io")
    h = c.acquire("x", ttl=10)
    h.release(timeout=6.0)  # long enough for the declared bound: inline
    assert threads_of(s, "release")[1] == threading.current_thread().name


def test_reentrant_release_by_one_of_two_holders_sends_nothing(make_client, store: MemoryStore) -> None:
    s = Recording(store, call_timeout=5.0)
    c = make_client(s)
    a = c.acquire("r", ttl=10, reentrant=True)
    b = c.acquire("r", ttl=10, reentrant=True)
    assert a.fencing_token == b.fencing_token
    a.release()
    assert store.holder("r") is not None and b.is_held()
    b.release()
    assert store.holder("r") is None
    assert [o for o, _ in s.log] == ["acquire", "release"]


def test_lost_event_first_looked_at_after_the_loss_is_set(make_client, clock: FakeClock) -> None:
    c = make_client()
    h = c.acquire("job", ttl=3)
    c.service.reject_renewals = True  # type: ignore[attr-defined]
    settle(clock, [c], seconds=3)
    assert h.state == "lost"
    assert h.lost.is_set() and h.lost.wait(0)
    assert h.lost is h.lost


@pytest.mark.parametrize("inline_io", [False, True])
def test_results_wait_for_a_paused_driver(make_client, store: MemoryStore, inline_io: bool) -> None:
    """Results are fed by the thread that got them, except while the driver is paused (a
    process pause): then they queue, and the driver feeds them when it resumes."""
    from leasehold.testing import pause_driver

    s = Recording(store, call_timeout=5.0)
    c = make_client(s, inline_io=inline_io)
    got: list[object] = []
    with pause_driver(c):
        t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10)), name="app")
        t.start()
        assert s.wait_calls(1)
        with c._cond:
            assert c._cond.wait_for(lambda: c._inflight == 0 and len(c._inputs) == 1, 10)
        assert threads_of(s, "acquire")[0].startswith("leasehold-io"), "no inline call while paused"
        assert not got and store.holder("x") is not None  # granted by the store, not yet seen
    t.join(10)
    assert len(got) == 1 and getattr(got[0], "state") == "held"
    getattr(got[0], "release")()
    assert store.holder("x") is None


def test_without_the_fast_path_a_woken_waiter_retries_on_the_pool(
    make_client, clock: FakeClock, store: MemoryStore
) -> None:
    holder = make_client()
    h1 = holder.acquire("x", ttl=10)
    s = Recording(store)  # no call_timeout: nothing runs on application threads
    c = make_client(s)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10, wait=60)), name="app")
    t.start()
    assert s.wait_calls(1)
    assert c.wait_idle()
    h1.release()
    t.join(10)
    assert not t.is_alive() and len(got) == 1 and getattr(got[0], "state") == "held"
    acq = threads_of(s, "acquire")
    assert len(acq) >= 2 and all(n.startswith("leasehold-io") for n in acq), acq
    getattr(got[0], "release")()


"""LockClient's inline path and driver wake-ups (memory service, fake clock).

A request runs on the thread that fed its cause when the executor's calls are bounded (a
declared ``call_timeout``, or ``inline_io=True``): the ACQUIRE of an application's own
acquire() and the RELEASE of its release() on the calling thread, a woken waiter's retry on
the thread that delivered the notification; timer-driven requests (renewals, retries after a
backoff) on the IO pool, and everything on the pool for an executor whose calls may block
without a bound (the memory executor's ``hang()``).
"""

from __future__ import annotations

import threading

import pytest
from core_helpers import Recording

from leasehold import LockClient
from leasehold.client import service_call_bound
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore, settle


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


@pytest.mark.parametrize(
    "call_timeout,inline_io,inline", [(None, None, False), (5.0, None, True), (5.0, False, False), (None, True, True)]
)
def test_the_inline_path_needs_a_call_bound_or_an_explicit_opt_in(
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


def test_a_woken_waiter_retries_on_the_thread_that_delivered_the_notification(
    make_client, clock: FakeClock, store: MemoryStore
) -> None:
    holder = make_client(Recording(store, call_timeout=5.0))
    h1 = holder.acquire("x", ttl=10)
    s = Recording(store, call_timeout=5.0)
    c = make_client(s)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10, wait=60)), name="app")
    t.start()
    assert s.wait_calls("acquire", 1)  # the first attempt (held by another), on the application thread
    assert c.wait_idle()
    before = len(s.threads_of("acquire"))
    assert s.threads_of("acquire")[0] == "app"
    h1.release()  # inline on this thread; the store's notification wakes the waiter here too
    t.join(10)
    assert not t.is_alive() and len(got) == 1
    h2 = got[0]
    assert getattr(h2, "state") == "held"
    me = threading.current_thread().name
    acq = s.threads_of("acquire")[before:]
    assert acq and set(acq) == {me}, acq
    getattr(h2, "release")()


def test_an_inline_transport_error_is_retried_with_the_same_token(
    make_client, clock: FakeClock, store: MemoryStore
) -> None:
    s = Recording(store, call_timeout=5.0)
    s.drop_next_responses(1)  # the grant happens in the store, its answer is lost
    c = make_client(s)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("x", ttl=10, wait=30)), name="app")
    t.start()
    assert s.wait_calls("acquire", 1) and c.wait_idle()
    while t.is_alive():  # let the core's backoff pass (fake time)
        settle(clock, [c], seconds=0.05, step=0.01)
        t.join(0.01)
    assert len(got) == 1
    h = got[0]
    assert getattr(h, "state") == "held"
    acq = s.threads_of("acquire")
    assert len(acq) == 2 and acq[0] == "app" and acq[1].startswith("leasehold-io"), acq  # the retry is timer-driven
    assert len(set(s.tokens)) == 1, "the retry carries the same ownership token"
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
    assert s.threads_of("release")[0].startswith("leasehold-io")
    h = c.acquire("x", ttl=10)
    h.release(timeout=6.0)  # long enough for the declared bound: inline
    assert s.threads_of("release")[1] == threading.current_thread().name


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
    assert s.ops() == ["acquire", "release"]


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
        assert s.wait_calls("acquire", 1)
        with c._cond:
            assert c._cond.wait_for(lambda: c._inflight == 0 and len(c._inputs) == 1, 10)
        assert s.threads_of("acquire")[0].startswith("leasehold-io"), "no inline call while paused"
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
    assert s.wait_calls("acquire", 1)
    assert c.wait_idle()
    h1.release()
    t.join(10)
    assert not t.is_alive() and len(got) == 1 and getattr(got[0], "state") == "held"
    acq = s.threads_of("acquire")
    assert len(acq) >= 2 and all(n.startswith("leasehold-io") for n in acq), acq
    getattr(got[0], "release")()


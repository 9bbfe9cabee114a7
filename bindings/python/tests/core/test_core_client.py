"""LockClient on the memory service and a fake clock: lifecycle, renewal, loss, waits."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from core_helpers import Recording, Result, svc

from leasehold import (
    ClientClosed,
    LeaseholdError,
    FencingGate,
    LockClient,
    LockHandle,
    LockNotHeld,
    LockTimeout,
    StaleFencingToken,
)
from leasehold.testing import FakeClock, MemoryStore, pause_driver, settle


def test_acquire_hold_release(make_client, store: MemoryStore) -> None:
    c = make_client()
    h = c.acquire("orders", ttl=3)
    assert isinstance(h, LockHandle)
    assert h.name == "orders"
    assert h.fencing_token == 1
    assert h.is_held()
    assert h.state == "held"
    assert h.valid_until is not None and h.remaining() > 2.5
    rec = store.holder("orders")
    assert rec is not None and rec.fencing_token == 1
    assert rec.token == svc(c).tokens[0] and len(rec.token) == 32
    h.release()
    assert store.holder("orders") is None
    assert not h.is_held()
    assert h.valid_until is None
    h.release()  # idempotent
    assert h.state == "released"


def test_context_manager_releases(make_client, store: MemoryStore) -> None:
    c = make_client()
    with c.acquire("a", ttl=2) as h:
        assert store.holder("a") is not None
        h.release()  # an explicit release inside the block does not break __exit__
    assert store.holder("a") is None


def test_contention_and_fencing_tokens_increase(make_client) -> None:
    a, b = make_client(), make_client()
    ha = a.acquire("x", ttl=3)
    with pytest.raises(LockTimeout) as ei:
        b.acquire("x", ttl=3)
    assert isinstance(ei.value, TimeoutError)
    assert "x" in str(ei.value)
    ha.release()
    hb = b.acquire("x", ttl=3)
    assert hb.fencing_token > ha.fencing_token
    hb.release()
    ha2 = a.acquire("x", ttl=3)
    assert ha2.fencing_token > hb.fencing_token


@pytest.mark.parametrize("ttl", [0.05, 0.3, 2.0, 30.0, 600.0, 86_400.0])
def test_renewal_keeps_lock_across_many_ttls(make_client, clock: FakeClock, store: MemoryStore, ttl: float) -> None:
    c = make_client()
    h = c.acquire("r", ttl=ttl)
    settle(clock, [c], seconds=5 * ttl, step=ttl / 10)
    assert h.is_held()
    assert not h.lost.is_set()
    counters = c.counters()
    assert counters.renewals_ok >= 12  # about three per TTL
    assert counters.renewals_failed == 0
    rec = store.holder("r")
    assert rec is not None and rec.fencing_token == h.fencing_token
    h.release()
    assert store.holder("r") is None


def test_rejected_renewal_loses_lock_once(make_client, clock: FakeClock) -> None:
    c = make_client()
    calls: list[LockHandle] = []
    h = c.acquire("job", ttl=3, on_lost=calls.append)
    svc(c).reject_renewals = True
    settle(clock, [c], seconds=3)
    assert h.lost.is_set()
    assert h.lost_reason == "rejected"
    assert calls == [h]
    assert not h.is_held()
    settle(clock, [c], seconds=6)
    assert calls == [h]  # exactly once
    h.release()  # a lost handle releases quietly
    assert c.counters().lost_rejected == 1


def test_gc_pause_loses_lock_and_gate_rejects_stale_write(make_client, clock: FakeClock, tmp_path: Path) -> None:
    db = tmp_path / "resource.db"
    conn_a, conn_b = sqlite3.connect(db), sqlite3.connect(db)
    gate_a, gate_b = FencingGate(conn_a), FencingGate(conn_b)
    gate_a.ensure_schema()
    conn_a.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER, last_token INTEGER)")
    conn_a.execute("INSERT INTO counter VALUES (1, 0, 0)")
    conn_a.commit()

    def increment(gate: FencingGate, token: int) -> None:
        with gate.guard("counter", token) as cur:
            cur.execute("SELECT n FROM counter WHERE id = 1")
            (n,) = cur.fetchone()
            cur.execute("UPDATE counter SET n = ?, last_token = ? WHERE id = 1", (n + 1, token))

    a, b = make_client(), make_client()
    lost_calls: list[LockHandle] = []
    ha = a.acquire("counter", ttl=3, on_lost=lost_calls.append)
    increment(gate_a, ha.fencing_token)

    with pause_driver(a):  # A freezes (a GC pause) while its lease runs out
        clock.advance(10)
        assert not ha.is_held()  # advisory check works even while the driver is frozen
        hb = b.acquire("counter", ttl=3)
        assert hb.fencing_token > ha.fencing_token
        increment(gate_b, hb.fencing_token)
        assert not ha.lost.is_set()  # nobody told A yet: its driver is frozen

    assert a.wait_idle()
    assert ha.lost.is_set()
    assert ha.lost_reason == "expired"
    assert lost_calls == [ha]
    # A resumes and, ignoring the signal, writes with its stale token: the gate refuses.
    with pytest.raises(StaleFencingToken) as ei:
        increment(gate_a, ha.fencing_token)
    assert ei.value.token == ha.fencing_token and ei.value.high_water_mark == hb.fencing_token
    row = conn_a.execute("SELECT n, last_token FROM counter").fetchone()
    assert row == (2, hb.fencing_token)
    settle(clock, [a], seconds=10)
    assert lost_calls == [ha]  # exactly once
    conn_a.close()
    conn_b.close()


def test_partition_grace_budget_then_lost(make_client, clock: FakeClock, store: MemoryStore) -> None:
    c = make_client()
    h = c.acquire("p", ttl=3)
    valid_until = h.valid_until_ns
    assert valid_until is not None
    svc(c).partition()
    # The first renewal fails: a transport failure is within the grace budget, still held.
    while c.counters().renewals_failed == 0 and clock.monotonic_ns() < valid_until:
        settle(clock, [c], seconds=0.01, step=0.01)
    assert c.counters().renewals_failed == 1
    assert h.is_held() and not h.lost.is_set()
    # Failures go on (retried promptly with backoff); the budget runs out before validity does.
    while not h.lost.is_set() and clock.monotonic_ns() < valid_until:
        settle(clock, [c], seconds=0.01, step=0.01)
    assert h.lost.is_set()
    assert clock.monotonic_ns() <= valid_until
    assert h.lost_reason in ("fail_budget", "expired")
    assert not h.is_held()
    # The lock expires on the service; after healing, it can be taken again.
    svc(c).heal()
    settle(clock, [c], seconds=3)
    h2 = c.acquire("p", ttl=3)
    assert h2.fencing_token > h.fencing_token


def test_hung_backend_does_not_delay_loss_detection(make_client, clock: FakeClock) -> None:
    c = make_client()
    h = c.acquire("hang", ttl=3)
    s = svc(c)
    s.hang()  # every backend call now blocks
    clock.advance(1.2)  # past the (maximally jittered) first renew time: the renew hangs
    assert s.called["renew"].wait(5)
    assert not h.lost.is_set()
    clock.advance(2.0)  # validity runs out while the renew call is still stuck
    assert h.lost.wait(5), "loss not detected while the backend hangs"
    assert h.lost_reason in ("expired", "fail_budget")
    assert not h.is_held()
    s.unhang()


def test_reentrant_acquire_shares_one_lease(make_client, store: MemoryStore) -> None:
    c = make_client()
    h1 = c.acquire("re", ttl=3, reentrant=True)
    h2 = c.acquire("re", ttl=3, reentrant=True)
    assert h1.fencing_token == h2.fencing_token
    assert svc(c).calls["acquire"] == 1  # no second network call
    h1.release()
    assert store.holder("re") is not None  # still held by h2
    assert h2.is_held()
    h2.release()
    assert store.holder("re") is None


def test_non_reentrant_second_acquire_in_same_client_times_out(make_client) -> None:
    c = make_client()
    h = c.acquire("nr", ttl=3)
    with pytest.raises(LockTimeout):
        c.acquire("nr", ttl=3)
    h.release()


def test_loss_reaches_every_reentrant_holder(make_client, clock: FakeClock) -> None:
    c = make_client()
    seen: list[LockHandle] = []
    h1 = c.acquire("re", ttl=3, reentrant=True, on_lost=seen.append)
    h2 = c.acquire("re", ttl=3, reentrant=True, on_lost=seen.append)
    svc(c).reject_renewals = True
    settle(clock, [c], seconds=3)
    assert h1.lost.is_set() and h2.lost.is_set()
    assert sorted(map(id, seen)) == sorted([id(h1), id(h2)])


def test_bounded_wait_times_out_while_holder_renews(make_client, clock: FakeClock) -> None:
    a, b = make_client(), make_client()
    ha = a.acquire("w", ttl=3)
    r = Result(lambda: b.acquire("w", ttl=3, wait=5))
    assert svc(b).called["acquire"].wait(5)
    settle(clock, [a, b], seconds=8, step=0.25)
    with pytest.raises(LockTimeout) as ei:
        r.get()
    assert ei.value.wait == 5
    assert ha.is_held()


def test_waiter_wakes_on_release_notification(make_client, clock: FakeClock) -> None:
    a, b = make_client(), make_client()
    ha = a.acquire("w", ttl=30)
    r = Result(lambda: b.acquire("w", ttl=3, wait=60))
    assert svc(b).called["acquire"].wait(5)
    assert b.wait_idle()
    assert not r.done.is_set()
    ha.release()  # no clock movement: only the notification can wake the waiter
    hb = r.get()
    assert hb.fencing_token == ha.fencing_token + 1
    hb.release()


def test_waiter_without_notifications_gets_lock_after_holder_expires(clock: FakeClock, store: MemoryStore) -> None:
    a = LockClient(Recording(store, notifications=False), clock=clock)
    b = LockClient(Recording(store, notifications=False), clock=clock)
    try:
        ha = a.acquire("w", ttl=3)
        r = Result(lambda: b.acquire("w", ttl=3, wait=20))
        assert b.service.called["acquire"].wait(5)  # type: ignore[attr-defined]
        a.service.partition()  # type: ignore[attr-defined]  # A dies quietly: its lock expires
        settle(clock, [a, b], seconds=10, step=0.25)
        hb = r.get()
        assert hb.fencing_token > ha.fencing_token
    finally:
        a.service.heal()  # type: ignore[attr-defined]
        a.close(timeout=1)
        b.close(timeout=1)


def test_close_cancels_waiting_acquire(make_client, clock: FakeClock) -> None:
    a = make_client()
    b = make_client()
    a.acquire("c", ttl=30)
    r = Result(lambda: b.acquire("c", ttl=3, wait=60))
    assert svc(b).called["acquire"].wait(5)
    b.close(timeout=1)
    with pytest.raises(ClientClosed):
        r.get()


def test_late_grant_after_timeout_is_released(make_client, clock: FakeClock, store: MemoryStore) -> None:
    c = make_client()
    s = svc(c)
    s.hang()
    r = Result(lambda: c.acquire("late", ttl=3, wait=1))
    assert s.called["acquire"].wait(5)
    # The wait budget and the request timeout run out (fake time) while the call hangs.
    clock.advance(5)
    with pytest.raises(LockTimeout):
        r.get()
    s.unhang()  # the hung call now completes and grants: the core releases it at once
    assert c.wait_idle()
    settle(clock, [c], seconds=1)
    assert store.holder("late") is None


def test_close_releases_held_locks_and_is_idempotent(make_client, store: MemoryStore) -> None:
    c = make_client()
    h1 = c.acquire("k1", ttl=30)
    h2 = c.acquire("k2", ttl=30)
    c.close()
    assert store.holder("k1") is None and store.holder("k2") is None
    assert not h1.is_held() and not h2.is_held()
    c.close()
    h1.release()
    with pytest.raises(ClientClosed):
        c.acquire("k3", ttl=3)


def test_close_with_partitioned_service_is_bounded(make_client, store: MemoryStore) -> None:
    c = make_client()
    c.acquire("k", ttl=30)
    svc(c).partition()
    c.close(timeout=0.2)  # cannot release; returns after the bound (the lock expires by TTL)
    assert c.closed
    assert store.holder("k") is not None


def test_on_lost_exception_is_logged_and_driver_survives(
    make_client, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_client()
    b = make_client()
    fired = threading.Event()

    def boom(h: LockHandle) -> None:
        fired.set()
        raise RuntimeError("callback bug")

    ha = a.acquire("lost-me", ttl=3, on_lost=boom)
    keep = a.acquire("keep-me", ttl=3)
    # Only renewals of lost-me are rejected: steal it on the store.
    svc(a).store.step_clock(10)  # the server's clock jumps: every lease there expires
    hb = b.acquire("lost-me", ttl=3)
    settle(clock, [a, b], seconds=3)
    assert fired.is_set() and ha.lost.is_set()
    assert any("callback bug" in (r.exc_text or "") or "callback" in r.getMessage() for r in caplog.records)
    # keep-me was also expired on the server by the clock step; re-acquire and keep renewing.
    keep.release()
    k2 = a.acquire("keep-me", ttl=3)
    settle(clock, [a, b], seconds=6)
    assert k2.is_held() and hb.is_held()


def test_on_release_is_refused_clearly_and_changes_nothing(make_client) -> None:
    """No backend's protocol hands release notifications to the application: the call says
    so instead of subscribing to nothing."""
    a, b = make_client(), make_client()
    with pytest.raises(LeaseholdError, match="on_release is not available"):
        b.on_release("topic", lambda name: None)
    h = a.acquire("topic", ttl=3)
    h.release()
    assert b.acquire("topic", ttl=3).fencing_token == h.fencing_token + 1


def test_with_on_lost_handle_raises_lock_not_held_on_enter(make_client, clock: FakeClock) -> None:
    c = make_client()
    h = c.acquire("e", ttl=3)
    h.release()
    with pytest.raises(LockNotHeld):
        with h:
            pass


def test_close_from_on_lost_callback(make_client, clock: FakeClock) -> None:
    c = make_client()
    done = threading.Event()

    def on_lost(h: LockHandle) -> None:
        c.close(timeout=0.5)
        done.set()

    c.acquire("x", ttl=3, on_lost=on_lost)
    svc(c).reject_renewals = True
    clock.advance(1.5)  # the first renew is sent and rejected: lost, on_lost closes the client
    assert done.wait(5)
    assert c.closed


def test_log_mentions_lost_lock(make_client, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="leasehold")
    c = make_client()
    c.acquire("logme", ttl=3)
    svc(c).reject_renewals = True
    settle(clock, [c], seconds=3)
    assert any("logme" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records)


def test_lost_acquire_answer_is_retried_idempotently(make_client, clock: FakeClock, store: MemoryStore) -> None:
    c = make_client()
    s = svc(c)
    s.drop_next_responses(1)  # the grant happens on the store, its answer is lost
    r = Result(lambda: c.acquire("idem", ttl=3, wait=5))
    assert s.called["acquire"].wait(5)
    settle(clock, [c], seconds=1, step=0.05)
    h = r.get()
    assert s.calls["acquire"] >= 2
    assert h.fencing_token == 1  # the retry found its own grant: same token, not locked out
    rec = store.holder("idem")
    assert store.stats()["grants"] == 1 and rec is not None and (rec.token, rec.fencing_token) == (s.tokens[0], 1)


def test_failed_release_keeps_token_and_is_retried(make_client, clock: FakeClock, store: MemoryStore) -> None:
    c = make_client()
    h = c.acquire("rel", ttl=30)
    svc(c).partition()
    h.release(timeout=0.1)  # the lease is no longer held locally; the service did not answer
    assert not h.is_held()
    assert store.holder("rel") is not None
    assert c.counters().pending_cleanups == 1
    svc(c).heal()
    settle(clock, [c], seconds=2)
    assert store.holder("rel") is None  # retried with the same token until it succeeded
    assert c.counters().pending_cleanups == 0


def test_release_from_another_thread(make_client, store: MemoryStore) -> None:
    c = make_client()
    h = c.acquire("t", ttl=3)
    t = threading.Thread(target=h.release)
    t.start()
    t.join(10)
    assert store.holder("t") is None and h.state == "released"


def test_on_lost_never_fires_for_a_lock_never_held(make_client, clock: FakeClock) -> None:
    a, b = make_client(), make_client()
    ha = a.acquire("n", ttl=3)
    fired: list[LockHandle] = []
    with pytest.raises(LockTimeout):
        b.acquire("n", ttl=3, on_lost=fired.append)
    settle(clock, [a, b], seconds=3)
    assert fired == [] and ha.is_held()


def test_delay_fault_is_measured_on_the_store_clock(make_client, clock: FakeClock) -> None:
    c = make_client()
    s = svc(c)
    s.delay = 0.5
    r = Result(lambda: c.acquire("d", ttl=3, wait=5))
    assert s.called["acquire"].wait(5)
    assert not r.done.wait(0.1)  # blocked on the fake clock, not on real time
    clock.advance(0.6)
    h = r.get()
    assert h.is_held()
    s.delay = 0.0


def test_server_clock_step_makes_renewal_rejected(make_client, clock: FakeClock, store: MemoryStore) -> None:
    a, b = make_client(), make_client()
    ha = a.acquire("step", ttl=3)
    store.step_clock(5)  # the server's clock jumps: A's grant expired there
    hb = b.acquire("step", ttl=3)
    settle(clock, [a, b], seconds=1.5)
    assert ha.lost.is_set() and ha.lost_reason == "rejected"
    assert hb.is_held() and hb.fencing_token > ha.fencing_token


def test_unreachable_backend_gives_backend_unavailable(make_client, clock: FakeClock) -> None:
    from leasehold import BackendUnavailable

    c = make_client()
    svc(c).partition()
    r = Result(lambda: c.acquire("down", ttl=3, wait=2))
    assert svc(c).called["acquire"].wait(5)
    settle(clock, [c], seconds=5, step=0.1)
    with pytest.raises(BackendUnavailable) as ei:
        r.get()
    assert isinstance(ei.value, LockTimeout) and "unavailable" in str(ei.value)

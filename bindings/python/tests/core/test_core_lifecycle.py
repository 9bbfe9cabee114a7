"""The end of a lease, honestly reported: manual renew, auto_renew=False, release outcomes,
release after a pause, and the renewal failure budget (fake clock, memory service), on
LockClient and AsyncLockClient."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from core_helpers import Recording, Result, svc

from leasehold import (
    AsyncLockClient,
    ClientClosed,
    Config,
    LockClient,
    LockLost,
    LockNotHeld,
    ReleaseOutcome,
    RenewTimeout,
)
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore, pause_driver, settle


class LostLog:
    """An on_lost callback that records every call (with the clock reading) and signals."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock
        self.calls: list[tuple[Any, int | None]] = []
        self.fired = threading.Event()

    def __call__(self, h: Any) -> None:
        self.calls.append((h, self.clock.monotonic_ns() if self.clock else None))
        self.fired.set()


# -- release after a pause ----------------------------------------------------------------------
def test_release_after_a_pause_past_validity_ends_lost(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    on_lost = LostLog()
    h = c.acquire("paused", ttl=3, on_lost=on_lost)
    with pause_driver(c):  # the driver sees nothing: the release is the first to learn of it
        clock.advance(10)
        outcome = h.release()
        assert outcome is ReleaseOutcome.LOST and outcome == "lost"
        assert h.state == "lost" and h.lost.is_set() and h.lost_reason == "expired"
    assert c.wait_idle()
    assert on_lost.fired.wait(5)
    assert [call[0] for call in on_lost.calls] == [h], "on_lost fires exactly once"
    assert h.release() == "lost", "a repeated release returns the first outcome"
    assert not h.is_held() and h.valid_until is None
    n = c.counters()
    assert n.releases_lost == 1 and n.lost_expired == 1 and n.releases_confirmed == 0
    settle(clock, [c], seconds=5)
    assert len(on_lost.calls) == 1


def test_release_on_the_inline_path_past_validity_ends_lost_and_cleans_up(
    clock: FakeClock, make_client: Any, store: MemoryStore
) -> None:
    c: LockClient = make_client(inline_io=True)
    on_lost = LostLog()
    h = c.acquire("inline", ttl=3, on_lost=on_lost)
    with c._mu:  # the driver cannot run: the release is the first to see the expiry
        clock.advance(10)
        assert h.release() is ReleaseOutcome.LOST
    assert c.wait_idle(10), "the cleanup release was sent and answered"
    assert h.lost.is_set() and on_lost.fired.wait(5) and len(on_lost.calls) == 1
    assert svc(c).calls["release"] == 1 and c.counters().pending_cleanups == 0
    assert store.holder("inline") is None


def test_release_within_validity_after_a_short_pause_ends_released(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    on_lost = LostLog()
    h = c.acquire("short", ttl=30, on_lost=on_lost)
    with pause_driver(c):
        clock.advance(5)  # well within validity
        assert h.release() == ReleaseOutcome.RELEASED
    assert c.wait_idle()
    assert h.state == "released" and not h.lost.is_set() and on_lost.calls == []


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 60))


def test_async_release_after_a_pause_past_validity_ends_lost() -> None:
    async def main() -> None:
        clock = FakeClock()
        fired: list[Any] = []

        async def on_lost(h: Any) -> None:
            fired.append(h)

        async with AsyncLockClient(MemoryLockService(MemoryStore(clock=clock)), clock=clock) as c:
            h = await c.acquire("paused", ttl=3, on_lost=on_lost)
            with pause_driver(c):  # type: ignore[arg-type]
                clock.advance(10)
                outcome = await h.release()
            assert outcome is ReleaseOutcome.LOST
            assert h.state == "lost" and h.lost.is_set() and h.lost_reason == "expired"
            assert await c.wait_idle()
            assert fired == [h]
            assert await h.release() == "lost"
            assert c.counters().releases_lost == 1

    run(main)


# -- release outcomes -------------------------------------------------------------------------------
def test_clean_release_reports_released_and_counts_it(make_client: Any, store: MemoryStore) -> None:
    c: LockClient = make_client()
    h = c.acquire("clean", ttl=5)
    outcome = h.release()
    assert outcome is ReleaseOutcome.RELEASED and isinstance(outcome, str) and str(outcome) == "released"
    assert store.holder("clean") is None
    assert h.release() is ReleaseOutcome.RELEASED
    assert svc(c).calls["release"] == 1, "a repeated release sends nothing"
    assert c.counters().releases_confirmed == 1
    with pytest.raises(LockNotHeld):
        with h:
            pass


def test_release_refused_by_the_service_reports_not_owner(
    clock: FakeClock, make_client: Any, store: MemoryStore
) -> None:
    a: LockClient = make_client()
    b: LockClient = make_client()
    ha = a.acquire("taken", ttl=10)
    store.step_clock(20)  # the grant runs out on the service only (its clock jumped)
    hb = b.acquire("taken", ttl=10)
    assert hb.fencing_token > ha.fencing_token
    assert ha.release() is ReleaseOutcome.NOT_OWNER
    assert ha.state == "released" and not ha.lost.is_set()
    assert store.holder("taken") is not None and store.holder("taken").fencing_token == hb.fencing_token
    assert a.counters().releases_not_owner == 1
    assert ha.release() == "not_owner"
    assert hb.release() == "released"


def test_async_release_outcomes() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        async with AsyncLockClient(MemoryLockService(store), clock=clock) as a, AsyncLockClient(
            MemoryLockService(store), clock=clock
        ) as b:
            h = await a.acquire("x", ttl=10)
            assert await h.release() is ReleaseOutcome.RELEASED
            ha = await a.acquire("y", ttl=10)
            store.step_clock(20)
            hb = await b.acquire("y", ttl=10)
            assert await ha.release() is ReleaseOutcome.NOT_OWNER
            assert await hb.release() is ReleaseOutcome.RELEASED
            assert a.counters().releases_not_owner == 1 and a.counters().releases_confirmed == 1

    run(main)


def test_release_of_a_lost_handle_reports_lost_without_a_call(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("rej", ttl=3)
    svc(c).reject_renewals = True
    settle(clock, [c], seconds=3)
    assert h.lost.is_set() and h.lost_reason == "rejected"
    calls = dict(svc(c).calls)
    assert h.release() is ReleaseOutcome.LOST
    assert dict(svc(c).calls) == calls


def test_reentrant_release_reports_released_per_holder(make_client: Any, store: MemoryStore) -> None:
    c: LockClient = make_client()
    h1 = c.acquire("re", ttl=5, reentrant=True)
    h2 = c.acquire("re", ttl=5, reentrant=True)
    assert h2.release() == "released" and h2.state == "released"
    assert h1.is_held() and store.holder("re") is not None
    assert h1.release() == "released" and store.holder("re") is None


def test_release_unanswered_within_its_timeout_reports_released(make_client: Any, store: MemoryStore) -> None:
    c: LockClient = make_client(release_timeout=0.05)
    h = c.acquire("slow", ttl=5)
    svc(c).drop_responses = True  # applied on the service, the answer lost: retried by the core
    assert h.release() is ReleaseOutcome.RELEASED
    assert store.holder("slow") is None


# -- manual renew -------------------------------------------------------------------------------------
def test_manual_renew_extends_validity(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("man", ttl=3, auto_renew=False)
    assert h.auto_renew is False
    before = h.valid_until
    assert before is not None
    clock.advance(1)
    after = h.renew(timeout=10)
    assert after == h.valid_until and after > before
    assert after == pytest.approx(before + 1, abs=0.01), "counted from the renewal's send time"
    assert svc(c).calls["renew"] == 1
    n = c.counters()
    assert n.renewals_requested == 1 and n.renewals_ok == 1
    # with automatic renewal on as well
    h2 = c.acquire("auto", ttl=3)
    clock.advance(0.5)
    v = h2.renew(timeout=10)
    assert v == h2.valid_until and h2.is_held()


def test_renew_after_release_or_loss_fails_fast_and_sends_nothing(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("gone", ttl=3)
    h.release()
    before, counters = dict(svc(c).calls), c.counters()
    with pytest.raises(LockNotHeld) as ei:
        h.renew()
    assert not isinstance(ei.value, LockLost)
    lost = c.acquire("lost", ttl=3)
    svc(c).reject_renewals = True
    settle(clock, [c], seconds=3)
    assert lost.lost.is_set()
    before, counters = dict(svc(c).calls), c.counters()
    with pytest.raises(LockLost) as el:
        lost.renew()
    assert el.value.reason == "rejected" and isinstance(el.value, LockNotHeld)
    assert dict(svc(c).calls) == before, "no call to the service"
    after = c.counters()
    assert (after.renewals_sent, after.renewals_requested) == (counters.renewals_sent, counters.renewals_requested)


def test_renew_past_validity_ends_lost_without_a_call(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    on_lost = LostLog()
    h = c.acquire("late", ttl=3, on_lost=on_lost, auto_renew=False)
    with pause_driver(c):
        clock.advance(5)
        with pytest.raises(LockLost) as ei:
            h.renew(timeout=10)
    assert ei.value.reason == "expired"
    assert svc(c).calls["renew"] == 0
    assert c.wait_idle() and on_lost.fired.wait(5) and len(on_lost.calls) == 1


def test_renew_waiting_through_an_outage_ends_lost(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("out", ttl=3)
    svc(c).partition()
    r = Result(lambda: h.renew(timeout=60))
    assert svc(c).called["renew"].wait(10)
    settle(clock, [c], seconds=4)
    with pytest.raises(LockLost) as ei:
        r.get()
    assert ei.value.name == "out" and ei.value.reason == h.lost_reason
    assert h.lost.is_set()


def test_renew_timeout_leaves_the_lease_alone(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("hung", ttl=30)
    svc(c).hang()
    with pytest.raises(RenewTimeout):
        h.renew(timeout=0.05)
    assert h.state == "held" and h.is_held()
    svc(c).unhang()


def test_renew_with_a_bad_timeout_sends_nothing(make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("badtimeout", ttl=3, auto_renew=False)
    with pytest.raises((TypeError, ValueError)):
        h.renew(timeout=-1)
    with pytest.raises(TypeError):
        h.renew(timeout="1")  # type: ignore[arg-type]
    assert svc(c).calls["renew"] == 0 and c.counters().renewals_requested == 0


def test_renew_on_a_closed_client(make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("closed", ttl=3)
    c.close()
    with pytest.raises((ClientClosed, LockNotHeld)):
        h.renew()


# -- auto_renew=False -------------------------------------------------------------------------------
def test_no_auto_renew_lease_is_lost_at_validity_end(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    on_lost = LostLog(clock)
    h = c.acquire("once", ttl=3, auto_renew=False, on_lost=on_lost)
    valid_until = h.valid_until_ns
    assert valid_until is not None
    settle(clock, [c], seconds=6, step=0.1)
    assert h.lost.is_set() and h.lost_reason == "expired"
    assert svc(c).calls["renew"] == 0
    assert on_lost.fired.wait(5) and len(on_lost.calls) == 1
    t_lost = on_lost.calls[0][1]
    assert t_lost is not None and valid_until <= t_lost < valid_until + int(0.2e9)


def test_no_auto_renew_lease_lives_while_renewed_by_hand(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client()
    h = c.acquire("byhand", ttl=3, auto_renew=False)
    for _ in range(6):
        settle(clock, [c], seconds=2, step=0.1)
        h.renew(timeout=10)
    assert h.is_held() and not h.lost.is_set()  # 12 s with a 3 s TTL
    assert svc(c).calls["renew"] == 6
    settle(clock, [c], seconds=4, step=0.1)
    assert h.lost.is_set() and h.lost_reason == "expired"


def test_async_manual_renew_and_no_auto_renew() -> None:
    async def main() -> None:
        clock = FakeClock()
        service = Recording(MemoryStore(clock=clock))
        async with AsyncLockClient(service, clock=clock) as c:
            h = await c.acquire("a", ttl=3, auto_renew=False)
            before = h.valid_until
            assert before is not None
            clock.advance(1)
            assert await c.wait_idle()
            v = await h.renew(timeout=10)
            assert v == h.valid_until and v > before
            for _ in range(30):  # 6 s without renewal, past validity
                clock.advance(0.2)
                assert await c.wait_idle()
            assert h.lost.is_set() and h.lost_reason == "expired"
            assert service.calls["renew"] == 1
            calls = dict(service.calls)
            with pytest.raises(LockLost):
                await h.renew()
            h2 = await c.acquire("b", ttl=3)
            await h2.release()
            with pytest.raises(LockNotHeld):
                await h2.renew()
            assert dict(service.calls) == {**calls, "acquire": calls["acquire"] + 1, "release": calls.get("release", 0) + 1}

    run(main)


# -- the failure budget ------------------------------------------------------------------------------
def test_default_fail_budget_is_the_time_budget() -> None:
    assert Config.defaults()["fail_budget"] == 0


def test_lease_survives_a_short_outage(clock: FakeClock, make_client: Any, store: MemoryStore) -> None:
    c: LockClient = make_client()
    on_lost = LostLog()
    h = c.acquire("outage", ttl=30, on_lost=on_lost)
    settle(clock, [c], seconds=9, step=0.1)  # the first renewal is due at about 10 s
    svc(c).partition()
    settle(clock, [c], seconds=3, step=0.05)
    assert c.counters().renewals_failed >= 1, "the outage cost renewals"
    svc(c).heal()
    settle(clock, [c], seconds=60, step=0.5)
    assert h.is_held() and not h.lost.is_set() and on_lost.calls == []
    rec = store.holder("outage")
    assert rec is not None and rec.fencing_token == h.fencing_token


def test_lease_whose_service_stays_unreachable_is_lost_before_validity_ends(
    clock: FakeClock, make_client: Any
) -> None:
    c: LockClient = make_client()
    on_lost = LostLog(clock)
    h = c.acquire("down", ttl=30, on_lost=on_lost)
    valid_until = h.valid_until_ns
    assert valid_until is not None
    svc(c).partition()
    seen_lost_at: int | None = None
    for _ in range(400):  # 40 s in 0.1 s steps
        clock.advance(0.1)
        assert c.wait_idle()
        if h.lost.is_set():
            seen_lost_at = clock.monotonic_ns()
            break
        assert clock.monotonic_ns() < valid_until, "still held past its validity"
    assert seen_lost_at is not None and seen_lost_at < valid_until, "lost before its validity ends"
    assert h.lost_reason == "fail_budget"
    assert on_lost.fired.wait(5) and len(on_lost.calls) == 1
    assert c.counters().renewals_failed >= 3, "transport failures were retried, not given up at once"


def test_count_fail_budget_is_settable(clock: FakeClock, make_client: Any) -> None:
    c: LockClient = make_client(fail_budget=2)
    h = c.acquire("count", ttl=30)
    svc(c).partition()
    settle(clock, [c], seconds=15, step=0.1)
    assert h.lost.is_set() and h.lost_reason == "fail_budget"
    assert c.counters().renewals_failed == 2
    with pytest.raises(TypeError):
        make_client(fail_budget="3")
    with pytest.raises(ValueError):
        make_client(fail_budget=-1)


def test_async_fail_budget_is_settable() -> None:
    async def main() -> None:
        clock = FakeClock()
        service = MemoryLockService(MemoryStore(clock=clock))
        async with AsyncLockClient(service, clock=clock, fail_budget=1) as c:
            h = await c.acquire("a", ttl=30)
            service.partition()
            for _ in range(150):
                clock.advance(0.1)
                assert await c.wait_idle()
            assert h.lost.is_set() and h.lost_reason == "fail_budget"
            assert c.counters().renewals_failed == 1

    run(main)


async def _advance(clock: FakeClock, c: AsyncLockClient, seconds: float, step: float) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)
        assert await c.wait_idle()


def test_async_lease_survives_a_short_outage() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        service = MemoryLockService(store)
        fired: list[Any] = []
        async with AsyncLockClient(service, clock=clock) as c:
            h = await c.acquire("outage", ttl=30, on_lost=fired.append)
            await _advance(clock, c, 9, 0.1)  # the first renewal is due at about 10 s
            service.partition()
            await _advance(clock, c, 3, 0.05)
            assert c.counters().renewals_failed >= 1, "the outage cost renewals"
            service.heal()
            await _advance(clock, c, 60, 0.5)
            assert h.is_held() and not h.lost.is_set() and fired == []
            rec = store.holder("outage")
            assert rec is not None and rec.fencing_token == h.fencing_token

    run(main)


def test_async_lease_whose_service_stays_unreachable_is_lost_before_validity_ends() -> None:
    async def main() -> None:
        clock = FakeClock()
        service = MemoryLockService(MemoryStore(clock=clock))
        fired: list[tuple[Any, int]] = []
        async with AsyncLockClient(service, clock=clock) as c:
            h = await c.acquire("down", ttl=30, on_lost=lambda lh: fired.append((lh, clock.monotonic_ns())))
            valid_until = h.valid_until_ns
            assert valid_until is not None
            service.partition()
            seen_lost_at: int | None = None
            for _ in range(400):  # 40 s in 0.1 s steps
                clock.advance(0.1)
                assert await c.wait_idle()
                if h.lost.is_set():
                    seen_lost_at = clock.monotonic_ns()
                    break
                assert clock.monotonic_ns() < valid_until, "still held past its validity"
            assert seen_lost_at is not None and seen_lost_at < valid_until, "lost before its validity ends"
            assert h.lost_reason == "fail_budget"
            assert await c.wait_idle()
            assert [f[0] for f in fired] == [h], "on_lost fires exactly once"
            assert fired[0][1] < valid_until
            assert c.counters().renewals_failed >= 3, "transport failures were retried, not given up at once"

    run(main)

"""AsyncLockClient: the same model on an event loop (fake clock, memory service)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # core_helpers
from core_helpers import Recording  # noqa: E402

from leasehold import AsyncLockClient, AsyncLockHandle, ClientClosed, LeaseholdError, LockNotHeld, LockTimeout, RenewTimeout  # noqa: E402
from leasehold.service import AsyncLockService, Granted, HeldByOther  # noqa: E402
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore  # noqa: E402


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 60))


async def asettle(clock: FakeClock, clients: list[AsyncLockClient], seconds: float, step: float) -> None:
    left = seconds
    for c in clients:
        assert await c.wait_idle()
    while left > 1e-12:
        d = min(step, left)
        clock.advance(d)
        left -= d
        for c in clients:
            assert await c.wait_idle()


def test_async_acquire_release_and_context_manager() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        async with AsyncLockClient(MemoryLockService(store), clock=clock) as c:
            async with c.acquire("a", ttl=3) as h:
                assert isinstance(h, AsyncLockHandle)
                assert h.fencing_token == 1 and h.is_held()
                assert store.holder("a") is not None
            assert store.holder("a") is None
            h2 = await c.acquire("a", ttl=3)
            assert h2.fencing_token == 2
            await h2.release()
            await h2.release()
            with pytest.raises(LockNotHeld):
                async with h2:
                    pass

    run(main)


def test_async_renewal_and_contention() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        a = AsyncLockClient(MemoryLockService(store), clock=clock)
        b = AsyncLockClient(MemoryLockService(store), clock=clock)
        h = await a.acquire("r", ttl=2)
        await asettle(clock, [a, b], seconds=10, step=0.2)
        assert h.is_held() and a.counters().renewals_ok >= 12
        with pytest.raises(LockTimeout):
            await b.acquire("r", ttl=2)
        # a bounded wait that runs out while the holder keeps renewing
        t = asyncio.ensure_future(b.acquire("r", ttl=2, wait=3))
        await asyncio.sleep(0)
        await asettle(clock, [a, b], seconds=4, step=0.2)
        with pytest.raises(LockTimeout):
            await t
        await a.close()
        await b.close()

    run(main)


def test_async_loss_fires_on_lost_once() -> None:
    async def main() -> None:
        clock = FakeClock()
        svc = MemoryLockService(clock=clock)
        seen: list[AsyncLockHandle] = []

        async def on_lost(h: AsyncLockHandle) -> None:
            seen.append(h)
            raise RuntimeError("logged, not fatal")

        async with AsyncLockClient(svc, clock=clock) as c:
            h = await c.acquire("l", ttl=3, on_lost=on_lost)
            svc.reject_renewals = True
            await asettle(clock, [c], seconds=6, step=0.1)
            assert h.lost.is_set() and h.lost_reason == "rejected"
            await asyncio.wait_for(h.lost.wait(), 5)
            assert seen == [h]
            assert not h.is_held()
            svc.reject_renewals = False
            h2 = await c.acquire("other", ttl=3)  # the driver survived the callback's exception
            assert h2.is_held()

    run(main)


def test_async_waiter_wakes_on_release() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        async with AsyncLockClient(MemoryLockService(store), clock=clock) as a, AsyncLockClient(
            MemoryLockService(store), clock=clock
        ) as b:
            ha = await a.acquire("w", ttl=30)
            t = asyncio.ensure_future(b.acquire("w", ttl=3, wait=60))
            await asyncio.sleep(0)
            assert await b.wait_idle()
            assert not t.done()
            await ha.release()
            hb = await asyncio.wait_for(t, 10)
            assert hb.fencing_token == ha.fencing_token + 1

    run(main)


def test_async_cancellation_releases_late_grant() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        svc = Recording(store)
        async with AsyncLockClient(svc, clock=clock) as c:
            svc.hang()
            t = asyncio.ensure_future(c.acquire("late", ttl=3, wait=30))
            await asyncio.to_thread(svc.called["acquire"].wait, 5)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            svc.unhang()  # the hung acquire completes with a grant nobody wants
            await asettle(clock, [c], seconds=1, step=0.1)
            assert store.holder("late") is None
            h = await c.acquire("late", ttl=3)
            assert h.is_held()

    run(main)


def test_async_calls_on_a_hung_service_end_by_their_bounds_and_cancels_propagate() -> None:
    """renew(timeout) raises RenewTimeout and release(timeout) returns by its bound while the
    service hangs; a task cancelled while it awaits release() or renew() gets CancelledError,
    the client goes on, and the release completes once the service answers."""

    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        svc = Recording(store)
        async with AsyncLockClient(svc, clock=clock) as c:
            h = await c.acquire("bound", ttl=30)
            g = await c.acquire("bound-2", ttl=30)
            svc.hang()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(RenewTimeout):
                await h.renew(timeout=0.2)
            assert 0.15 < loop.time() - t0 < 2.0
            renewing = asyncio.ensure_future(g.renew(timeout=30))
            releasing = asyncio.ensure_future(h.release(timeout=30))
            await asyncio.sleep(0.05)
            for t in (renewing, releasing):
                t.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await t
            t0 = loop.time()
            await g.release(timeout=0.2)
            assert 0.15 < loop.time() - t0 < 2.0
            svc.unhang()
            await asettle(clock, [c], seconds=1, step=0.1)
            assert store.holder("bound") is None and store.holder("bound-2") is None
            assert (await c.acquire("bound", ttl=3)).is_held()

    run(main)


def test_async_bounded_wait() -> None:
    """The wait under every acquire(), release() and renew() (``aio._bounded``): a result or an
    exception already there, one that comes, a bound that runs out first (the future is then
    cancelled: nobody waits for it), and a cancellation of the caller, also one that comes as
    the bound runs out, which is never swallowed."""
    from leasehold.aio import _bounded

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        done.set_result(1)
        assert await _bounded(done, 0)
        failed = loop.create_future()
        failed.set_exception(LockTimeout("n", 0.0))
        with pytest.raises(LockTimeout):
            await _bounded(failed, 10)
        later = loop.create_future()
        loop.call_later(0.02, later.set_result, 2)
        assert await _bounded(later, 10) and later.result() == 2
        never = loop.create_future()
        t0 = loop.time()
        assert not await _bounded(never, 0.05)
        assert loop.time() - t0 >= 0.04 and never.cancelled()
        waited = loop.create_future()
        task = asyncio.ensure_future(_bounded(waited, 10))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The caller is cancelled after the bound ran out but before it resumed.
        both = loop.create_future()
        task = asyncio.ensure_future(_bounded(both, 0.02))
        both.add_done_callback(lambda _: task.cancel())  # runs before the task resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        assert both.cancelled()

    run(main)


def test_async_reentrant_acquire_of_a_held_name_returns_at_once() -> None:
    async def main() -> None:
        async with AsyncLockClient(MemoryLockService(MemoryStore())) as c:
            h = await c.acquire("twice", ttl=30, reentrant=True)
            h2 = await c.acquire("twice", ttl=30, reentrant=True)
            assert h2.fencing_token == h.fencing_token
            await h2.release()
            assert h.is_held()
            with pytest.raises(LockTimeout):
                await c.acquire("twice", ttl=30, reentrant=False)

    run(main)


def test_async_closed_client_and_bad_inputs() -> None:
    async def main() -> None:
        clock = FakeClock()
        c = AsyncLockClient(MemoryLockService(clock=clock), clock=clock)
        with pytest.raises(TypeError):
            c.acquire(5, ttl=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            c.acquire("x", ttl=-1)
        with pytest.raises(ValueError):
            await c.acquire("", ttl=3)
        h = await c.acquire("x", ttl=3)
        await c.close()
        await c.close()
        assert not h.is_held()
        with pytest.raises(ClientClosed):
            await c.acquire("x", ttl=3)

    run(main)


def test_async_close_cancels_waiter() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        a = AsyncLockClient(MemoryLockService(store), clock=clock)
        b = AsyncLockClient(MemoryLockService(store), clock=clock)
        await a.acquire("c", ttl=30)
        t = asyncio.ensure_future(b.acquire("c", ttl=3, wait=60))
        await asyncio.sleep(0)
        assert await b.wait_idle()
        await b.close(timeout=1)
        with pytest.raises(ClientClosed):
            await t
        await a.close()

    run(main)


def test_async_close_stops_the_driver_and_cancels_an_awaiting_acquire() -> None:
    """close() leaves no task of the client behind (a cancel swallowed by ``wait_for`` on
    Python 3.11 once left the driver running), and cancelling the task awaiting an acquire
    cancels the acquire."""

    async def main() -> None:
        store = MemoryStore()  # the real clock: the driver sleeps with a timeout
        a = AsyncLockClient(MemoryLockService(store))
        b = AsyncLockClient(MemoryLockService(store))
        async with a.acquire("d", ttl=3):
            pass
        held = await a.acquire("d", ttl=30)
        waiting = asyncio.ensure_future(b.acquire("d", ttl=3, wait=60))
        await asyncio.sleep(0)
        assert await b.wait_idle()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await b.wait_idle()
        await held.release()
        assert store.holder("d") is None, "the cancelled acquire took nothing"
        for c in (a, b):
            driver = c._driver
            await c.close()
            assert driver is not None and driver.done(), "the driver still runs after close()"
        # (run() awaits main() inside wait_for: that task is the harness's.)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t.get_coro().__name__ != "wait_for"]
        assert not others, others

    run(main)


class NativeAsyncService(AsyncLockService):
    """A lock service of one's own: not an executor, so no client drives it."""

    async def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        return Granted(1, ttl_ms)

    async def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        return True

    async def release(self, name: str, token: str, backend_data: bytes) -> bool:
        return True


def test_async_client_refuses_a_lock_service_of_its_own_and_names_the_executors() -> None:
    with pytest.raises(TypeError, match="NativeAsyncService is a LockService of its own.*MemoryExecutor"):
        AsyncLockClient(NativeAsyncService())


def test_async_client_is_bound_to_one_loop() -> None:
    clock = FakeClock()
    c = AsyncLockClient(MemoryLockService(clock=clock), clock=clock)

    async def use() -> None:
        h = await c.acquire("x", ttl=3)
        await h.release()

    asyncio.run(use())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(use())


def test_async_on_release_is_refused_clearly() -> None:
    async def main() -> None:
        clock = FakeClock()
        async with AsyncLockClient(MemoryLockService(clock=clock), clock=clock) as c:
            with pytest.raises(TypeError, match="callback"):
                c.on_release("topic", 42)  # type: ignore[arg-type]
            with pytest.raises(LeaseholdError, match="on_release is not available"):
                c.on_release("topic", lambda name: None)
            h = await c.acquire("topic", ttl=3)  # the client is unchanged
            await h.release()

    run(main)

"""An application call keeps its bound when the server stalls: the IO run on the caller's
thread ends by the caller's deadline and the rest continues in the background.

A proxy holds back every reply of a real redis-server for ``STALL`` seconds. The bounds
asserted are those the calls document (plus a margin for a loaded machine), never a speed.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from leasehold import Config, LockClient, LockTimeout, ReleaseOutcome
from leasehold.aio import AsyncLockClient
from leasehold.backends.redis_executor import RedisExecutor
from leasehold.backends.redis_executor_async import AsyncRedisExecutor
import lh_caller_bound as bound
from lh_keys import keys_for
from lh_stall_proxy import StallProxy
from polling import wait_until

STALL = 1.5
MARGIN = 0.5
REQUEST_TIMEOUT = Config(request_timeout_ns=300_000_000)  # an acquire's bound: wait + 0.3 s


@pytest.fixture
def proxy(redis_server, r):  # type: ignore[no-untyped-def]
    p = StallProxy("127.0.0.1", redis_server.port)
    yield p
    p.close()


def _executor(p: StallProxy) -> RedisExecutor:
    return RedisExecutor(url=p.url, socket_timeout=5.0)


def test_release_with_a_timeout_returns_by_it_and_the_release_completes_later(proxy, r, redis_server):  # type: ignore[no-untyped-def]
    bound.release_returns_by_its_timeout(proxy, lambda: _executor(proxy), lambda: RedisExecutor(url=redis_server.url))
    assert not r.exists(keys_for("rel").lock)


def test_release_without_a_timeout_keeps_the_release_timeout(proxy, r, redis_server):  # type: ignore[no-untyped-def]
    bound.release_keeps_the_release_timeout(proxy, lambda: _executor(proxy), lambda: RedisExecutor(url=redis_server.url))
    assert not r.exists(keys_for("reldef").lock)


def test_acquire_fails_by_its_bound_and_a_late_grant_is_released(proxy, r, redis_server):  # type: ignore[no-untyped-def]
    k = keys_for("acq")
    with LockClient(_executor(proxy), config=REQUEST_TIMEOUT) as c:
        c.acquire("warm", ttl=30).release()  # the scripts are loaded: the stalled ACQUIRE grants
        proxy.delay = STALL
        t0 = time.monotonic()
        with pytest.raises(LockTimeout):
            c.acquire("acq", ttl=30, wait=0.1)
        took = time.monotonic() - t0
        assert took < 0.1 + 0.3 + MARGIN, f"acquire(wait=0.1) took {took:.3f}s"
        assert r.exists(k.lock), "the server granted the stalled ACQUIRE"
        proxy.delay = 0
        # The grant answered after the acquire failed is released: no lock leaks.
        wait_until(lambda: not r.exists(k.lock), bound=30, what="the late grant released")
        wait_until(lambda: c.counters().live_leases == 0, bound=30, what="no live lease")
        with LockClient(RedisExecutor(url=redis_server.url)) as other:
            other.acquire("acq", ttl=5).release()


def test_the_async_client_keeps_its_bounds(proxy, r):  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with AsyncLockClient(AsyncRedisExecutor(url=proxy.url, socket_timeout=5.0), config=REQUEST_TIMEOUT) as c:
            h = await c.acquire("arel", ttl=30)
            proxy.delay = STALL
            t0 = time.monotonic()
            assert await h.release(timeout=0.1) is ReleaseOutcome.RELEASED
            assert time.monotonic() - t0 < 0.1 + MARGIN
            t0 = time.monotonic()
            with pytest.raises(LockTimeout):
                await c.acquire("aacq", ttl=30, wait=0.1)
            assert time.monotonic() - t0 < 0.1 + 0.3 + MARGIN
            proxy.delay = 0
            for _ in range(1500):
                if not r.exists(keys_for("arel").lock) and not r.exists(keys_for("aacq").lock):
                    break
                await asyncio.sleep(0.02)
            assert not r.exists(keys_for("arel").lock) and not r.exists(keys_for("aacq").lock)

    asyncio.run(main())


def test_uncontended_calls_run_on_the_callers_thread(proxy):  # type: ignore[no-untyped-def]
    import threading

    seen: list[str] = []

    class Recording(RedisExecutor):
        def command_within(self, argv, timeout):  # type: ignore[no-untyped-def]
            seen.append(threading.current_thread().name)
            return super().command_within(argv, timeout)

    with LockClient(Recording(url=proxy.url)) as c:
        c.acquire("fast", ttl=30).release()
    assert seen and set(seen) == {threading.current_thread().name}

"""``AsyncLockClient`` on the byte path (``AsyncRedisStreamExecutor``: the core owns the wire,
the event loop moves the bytes), against a real redis-server: concurrent tasks of two clients
contending for one name, the synchronous executor and ``from_url`` in ``AsyncLockClient``
(run on the loop, no stream thread), a server restart, and a stalled server (through
:class:`~lh_stall_proxy.StallProxy`): every call ends by its bound while the loop keeps
running. Every read reaches the core with its drain, in one crossing, and every write on an
open stream leaves from the drain that asks for it (a subclass's ``write`` still sees each).
Bounds asserted are those the calls document plus a margin, never a speed."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from either_client import refused_by_lock_client  # noqa: E402
from lh_caller_bound import MARGIN, REQUEST_TIMEOUT, STALL  # noqa: E402
from lh_feeds import count_feeds  # noqa: E402
from lh_keys import keys_for  # noqa: E402
from lh_stall_proxy import StallProxy  # noqa: E402

from leasehold import AsyncLockClient, LockClient, LockTimeout, ReleaseOutcome  # noqa: E402
from leasehold.backends.redis import RedisLockService  # noqa: E402
from leasehold.backends.redis_async import AsyncRedisLockService  # noqa: E402
from leasehold.backends.redis_stream import RedisStreamExecutor  # noqa: E402
from leasehold.backends.redis_stream_async import AsyncRedisStreamExecutor  # noqa: E402


def _stream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("leasehold-stream")]


class Ticker:
    """A task that ticks every 10 ms: the longest gap between two ticks is how long the loop
    was blocked."""

    def __init__(self) -> None:
        self.gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.gap = max(self.gap, now - last)
            last = now

    def __enter__(self) -> "Ticker":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_concurrent_tasks_of_two_clients_take_turns(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    url = redis_server.url
    inside: list[int] = []
    grants: list[int] = []

    async def worker(client: AsyncLockClient, rounds: int) -> None:
        for _ in range(rounds):
            async with client.acquire("py-async-bytes", ttl=10, wait=30) as lock:
                assert not inside, "two holders at once"
                inside.append(lock.fencing_token)
                grants.append(lock.fencing_token)
                await asyncio.sleep(0.002)
                inside.pop()

    async def main() -> tuple[Any, Any, float]:
        with Ticker() as ticker:
            async with AsyncLockClient(AsyncRedisStreamExecutor(url)) as a, AsyncLockClient(
                AsyncRedisStreamExecutor(url)
            ) as b:
                await asyncio.gather(*(worker(c, 5) for c in (a, b) for _ in range(4)))
                assert not _stream_threads(), _stream_threads()  # all on the loop
                return a.counters(), b.counters(), ticker.gap

    ka, kb, gap = asyncio.run(asyncio.wait_for(main(), 120))
    assert len(grants) == 40 and grants == sorted(grants) and len(set(grants)) == 40
    assert int(r.get(keys_for("py-async-bytes").fence)) == grants[-1]
    assert not r.exists(keys_for("py-async-bytes").lock)
    for k in (ka, kb):
        # The commands and subscriber streams, opened once each by the core, none lost.
        assert 1 <= k.stream_opens <= 2 and k.stream_closes == 0, k
    print(f"longest loop gap while 8 tasks contended: {gap * 1000:.1f} ms")


@pytest.mark.parametrize("how", ["RedisStreamExecutor", "RedisLockService.from_url", "AsyncRedisLockService.from_url"])
def test_the_byte_path_executors_run_on_the_loop(redis_server, r, how: str) -> None:  # type: ignore[no-untyped-def]
    make = {
        "RedisStreamExecutor": RedisStreamExecutor,
        "RedisLockService.from_url": RedisLockService.from_url,
        "AsyncRedisLockService.from_url": AsyncRedisLockService.from_url,
    }[how]

    async def main() -> int:
        async with AsyncLockClient(make(redis_server.url)) as c:
            held = await c.acquire("py-async-twin", ttl=5)
            with pytest.raises(LockTimeout):
                await c.acquire("py-async-twin", ttl=5, wait=0.2)  # one holder at a time
            assert await held.release() == ReleaseOutcome.RELEASED
            async with c.acquire("py-async-twin", ttl=5) as lock:
                assert lock.fencing_token > held.fencing_token
            assert not _stream_threads(), _stream_threads()
            assert c.counters().stream_opens >= 1
            return lock.fencing_token

    assert asyncio.run(asyncio.wait_for(main(), 60)) == int(r.get(keys_for("py-async-twin").fence))


def test_every_read_reaches_the_core_with_its_drain(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """Bytes the loop reads go to the core in one crossing with the drain they cause
    (``Core.step(stream, data)``), never fed alone first."""
    async def main() -> tuple[list[int], list[int]]:
        async with AsyncLockClient(AsyncRedisStreamExecutor(redis_server.url)) as c:
            alone, drained = count_feeds(c._core)
            for _ in range(3):
                async with c.acquire("py-async-drain", ttl=5):
                    pass
            return alone, drained

    alone, drained = asyncio.run(asyncio.wait_for(main(), 60))
    assert not alone and len(drained) >= 6, (alone, drained)  # two replies a cycle at least
    assert not r.exists(keys_for("py-async-drain").lock)


def test_an_uncontended_cycle_writes_from_the_drain_and_starts_no_task(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """A write on an open stream leaves in the drain that asks for it (``write_now``): an
    uncontended acquire + release starts no task."""
    async def main() -> list[str]:
        async with AsyncLockClient(AsyncRedisStreamExecutor(redis_server.url)) as c:
            await (await c.acquire("py-async-notask", ttl=5)).release()  # connections open
            spawned: list[str] = []
            spawn = c._spawn

            def counting(coro: Any) -> None:
                spawned.append(coro.__qualname__)
                spawn(coro)

            c._spawn = counting  # type: ignore[method-assign]
            for _ in range(3):
                async with c.acquire("py-async-notask", ttl=5) as lock:
                    assert int(r.get(keys_for("py-async-notask").fence)) == lock.fencing_token
            return spawned

    assert asyncio.run(asyncio.wait_for(main(), 60)) == []
    assert not r.exists(keys_for("py-async-notask").lock)


def test_a_subclass_that_overrides_write_sees_every_write(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """``write`` is an extension point: a subclass that overrides it gets every write (the
    drain's ``write_now`` is not used for it)."""
    seen: list[bytes] = []

    class Watching(AsyncRedisStreamExecutor):
        async def write(self, stream: int, data: bytes) -> None:
            seen.append(data)
            await super().write(stream, data)

    async def main() -> None:
        async with AsyncLockClient(Watching(redis_server.url)) as c:
            for _ in range(3):
                async with c.acquire("py-async-watched", ttl=5):
                    pass

    asyncio.run(asyncio.wait_for(main(), 60))
    scripts = [d for d in seen if b"EVAL" in d]  # EVALSHA, or EVAL once after NOSCRIPT
    assert len(scripts) >= 6, [d[:40] for d in seen]  # an ACQUIRE and a RELEASE a cycle
    assert not r.exists(keys_for("py-async-watched").lock)


def test_a_write_that_fails_in_the_drain_closes_its_stream_and_the_acquire_goes_on(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """A write the drain hands over that raises (the connection broke under it) reaches the core
    as that stream's close, once: the core opens a new stream and the acquire, within its wait,
    is granted there with a higher fence. The transport's own report of the loss that follows
    is a late duplicate, counted and ignored."""

    class Breaking(AsyncRedisStreamExecutor):
        armed = False
        broke = 0

        # write beside write_now: the drain uses a write_now only from the class whose write
        # it stands for.
        async def write(self, stream: int, data: bytes) -> None:
            await super().write(stream, data)

        def write_now(self, stream: int, data: bytes) -> bool:
            if self.armed and b"EVAL" in data:
                self.armed = False
                self.broke += 1
                transport = self._streams[stream].transport
                assert transport is not None
                transport.abort()
                raise BrokenPipeError("broken pipe")
            return super().write_now(stream, data)

    async def main() -> tuple[Any, int, int, Any]:
        ex = Breaking(redis_server.url)
        async with AsyncLockClient(ex) as c:
            async with c.acquire("py-async-broken", ttl=5) as first:
                pass
            before = c.counters()
            ex.armed = True
            async with c.acquire("py-async-broken", ttl=5, wait=10) as lock:
                assert int(r.get(keys_for("py-async-broken").fence)) == lock.fencing_token
                assert ex.broke == 1
            return before, first.fencing_token, lock.fencing_token, c.counters()

    before, first, second, k = asyncio.run(asyncio.wait_for(main(), 60))
    assert second > first
    assert (before.stream_opens, before.stream_closes) == (2, 0), before
    assert (k.stream_opens, k.stream_closes) == (3, 1), k
    assert k.backend_transport_failures >= 1 and k.releases_confirmed == 2, k
    assert not r.exists(keys_for("py-async-broken").lock)


def test_the_async_executor_is_refused_by_lock_client(redis_server) -> None:  # type: ignore[no-untyped-def]
    refused_by_lock_client(AsyncRedisStreamExecutor(redis_server.url), "leasehold.backends.redis_stream.RedisStreamExecutor")
    refused_by_lock_client(AsyncRedisLockService.from_url(redis_server.url), "leasehold.backends.redis.RedisLockService")


def test_the_async_client_reconnects_after_a_restart(redis_factory) -> None:  # type: ignore[no-untyped-def]
    srv = redis_factory()

    async def main() -> Any:
        async with AsyncLockClient(AsyncRedisStreamExecutor(f"redis://127.0.0.1:{srv.port}/2")) as c:
            async with c.acquire("py-async-restart-1", ttl=5):
                pass
            await asyncio.to_thread(srv.restart)
            async with c.acquire("py-async-restart-2", ttl=5, wait=20) as lock:
                assert lock.fencing_token > 0
                assert srv.client(db=2).exists(keys_for("py-async-restart-2").lock)
            return c.counters()

    k = asyncio.run(asyncio.wait_for(main(), 90))
    assert k.stream_closes >= 1 and k.stream_opens >= 2, k


@pytest.fixture
def stall(redis_server, r):  # type: ignore[no-untyped-def]
    p = StallProxy("127.0.0.1", redis_server.port)
    yield p
    p.close()


def test_a_stalled_server_bounds_every_call_and_never_blocks_the_loop(stall, redis_server, r) -> None:  # type: ignore[no-untyped-def]
    async def main() -> float:
        with Ticker() as ticker:
            async with AsyncLockClient(AsyncRedisStreamExecutor(stall.url), config=REQUEST_TIMEOUT) as c:
                await (await c.acquire("warm", ttl=30)).release()  # connections ready: the stall is the IO's
                held = await c.acquire("rel", ttl=30)
                stall.delay = STALL
                # acquire(wait=0.1), several at once: each fails by the wait plus one request timeout.
                t0 = time.monotonic()
                results = await asyncio.gather(
                    *(c.acquire(f"acq-{i}", ttl=30, wait=0.1) for i in range(3)), return_exceptions=True
                )
                took = time.monotonic() - t0
                assert all(isinstance(e, LockTimeout) for e in results), results
                assert took < 0.1 + 0.3 + MARGIN, f"acquire(wait=0.1) took {took:.3f}s"
                # release(timeout=0.1) returns by its bound; the release completes later.
                t0 = time.monotonic()
                assert await held.release(timeout=0.1) == ReleaseOutcome.RELEASED
                took = time.monotonic() - t0
                assert took < 0.1 + MARGIN, f"release(timeout=0.1) took {took:.3f}s"
                stall.delay = 0
                end = time.monotonic() + 30
                while c.counters().live_leases or c.counters().pending_cleanups:
                    assert time.monotonic() < end, c.counters()
                    await asyncio.sleep(0.02)
            return ticker.gap

    gap = asyncio.run(asyncio.wait_for(main(), 90))
    assert gap < 0.25, f"the loop was blocked for {gap:.3f}s"
    for name in ("rel", "acq-0", "acq-1", "acq-2"):
        assert not r.exists(keys_for(name).lock), f"{name} leaked on the server"
    with LockClient(RedisStreamExecutor(redis_server.url)) as other:  # free for another client at once
        other.acquire("rel", ttl=5, wait=0).release()


def test_the_module_docstring_example_takes_a_lock(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    import textwrap

    from docstring_examples import examples, run_example

    (code,) = examples("leasehold.backends.redis_stream_async")
    assert "redis://127.0.0.1:6379/0" in code
    tokens: list[int] = []

    async def write_report(fencing_token: int) -> None:
        tokens.append(fencing_token)

    body = textwrap.indent(code.replace("redis://127.0.0.1:6379/0", redis_server.url), "    ")
    ns = run_example(f"async def example():\n{body}\n", {"write_report": write_report})
    asyncio.run(asyncio.wait_for(ns["example"](), 60))
    assert len(tokens) == 1 and tokens[0] == int(r.get(keys_for("reports").fence))
    assert not r.exists(keys_for("reports").lock)


def test_closing_the_async_client_closes_the_from_url_service(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """``AsyncLockClient`` (owning the service) closes the twin's streams and the redis-py
    client the sync service made for the application (``.client``)."""
    from polling import wait_until

    svc = RedisLockService.from_url(redis_server.url, client_name="lh-twin")
    assert svc.client.ping()  # the application's own redis-py connection, named too

    def named() -> int:
        return [c.get("name") for c in r.client_list()].count("lh-twin")

    async def main() -> None:
        async with AsyncLockClient(svc) as c:
            async with c.acquire("py-twin", ttl=5):
                assert named() >= 2  # the redis-py connection and the core's commands stream

    asyncio.run(asyncio.wait_for(main(), 60))
    wait_until(lambda: named() == 0, bound=10, what="every lh-twin connection closed")

"""RedisLockService / AsyncRedisLockService: the executors under their first names, with their
first constructors, driving LockClient / AsyncLockClient on a real redis-server: ``from_url``
on the byte path (the core's own connections), ``RedisLockService(client)`` on the redis-py
adapter.

What the protocol does (handoff cost, frozen waiters, garbage keys, killed subscribers) is
tested on the executor (test_redis_executor.py); here: that code written for the services
keeps working, and what only they offer (``status``, ``ping``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis

from leasehold import AsyncLockClient, LockClient, errors
from leasehold.backends.redis import ProtocolError, RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService
from leasehold.backends.redis_executor import RedisExecutor
from leasehold.backends.redis_executor_async import AsyncRedisExecutor
from leasehold.backends.redis_stream import RedisStreamExecutor
from leasehold.backends.redis_stream_async import AsyncRedisStreamExecutor
from lh_keys import holder_of, keys_for


def service(url: str, **kw) -> RedisLockService:  # type: ignore[no-untyped-def]
    kw.setdefault("socket_timeout", 1.0)
    kw.setdefault("socket_connect_timeout", 1.0)
    return RedisLockService.from_url(url, **kw)


def wait_for(pred, timeout: float = 30.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


class Acquirer(threading.Thread):
    def __init__(self, client: LockClient, name: str, ttl: float, wait: float) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.ttl, self.wait = client, name, ttl, wait
        self.handle = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.handle = self.client.acquire(self.name, ttl=self.ttl, wait=self.wait)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def redis_py_service(url: str, **kw) -> RedisLockService:  # type: ignore[no-untyped-def]
    """The redis-py adapter: a client of the application's own (socket timeouts as ``service``)."""
    kw.setdefault("socket_timeout", 1.0)
    kw.setdefault("socket_connect_timeout", 1.0)
    return RedisLockService(redis.Redis.from_url(url, **kw), owns_client=True)


PATHS = {"bytes": service, "redis-py": redis_py_service}


def test_from_url_takes_the_byte_path_with_the_services_api(redis_server, r):
    # Protocol-3 and subscriber tuning arguments are accepted (and ignored).
    s = RedisLockService.from_url(redis_server.url, direct_grants=False, pubsub_linger=0.2, pubsub_ping_interval=5)
    try:
        assert isinstance(s, RedisLockService) and isinstance(s, RedisStreamExecutor)
        assert not isinstance(s, RedisExecutor)
        assert s.backend_protocol == "stream" and s.ping() is True
        assert s.client.ping()  # a redis-py client made from the same URL
        assert s.client is s.client
        with LockClient(s, owns_service=False) as c:
            with c.acquire("bytes", ttl=5) as h:
                assert holder_of(r, "bytes")[0] == h.fencing_token  # type: ignore[index]
            k = c.counters()
            assert k.stream_opens >= 1, k  # the core opened its own connections
    finally:
        s.close()
    a = AsyncRedisLockService.from_url(redis_server.url)
    assert isinstance(a, AsyncRedisLockService) and isinstance(a, AsyncRedisStreamExecutor)
    assert a.backend_protocol == "stream"
    for bad in ({"pubsub_ping_interval": 0}, {"pubsub_linger": -1}, {"socket_timeout": -1}):
        with pytest.raises(ValueError):
            RedisLockService.from_url(redis_server.url, **bad)
        with pytest.raises(ValueError):
            AsyncRedisLockService.from_url(redis_server.url, **bad)


def test_from_url_maps_the_keywords_with_a_meaning_and_refuses_the_others(redis_server, r):
    s = RedisLockService.from_url(
        redis_server.url, socket_timeout=0.7, socket_connect_timeout=0.4, client_name="lh-kw", protocol=2
    )
    try:
        o = s.options
        assert (o.request_timeout_ms, o.connect_timeout_ms, o.client_name, o.resp) == (700, 400, "lh-kw", 2)
        with LockClient(s, owns_service=False) as c:
            c.acquire("kw", ttl=5).release()
            names = [cl.get("name") for cl in r.client_list()]
            assert "lh-kw" in names, names
    finally:
        s.close()
    with pytest.raises(TypeError) as e:
        RedisLockService.from_url(redis_server.url, retry_on_timeout=True, max_connections=3)
    assert "max_connections, retry_on_timeout" in str(e.value) and "RedisLockService(redis.Redis" in str(e.value)
    with pytest.raises(TypeError):
        AsyncRedisLockService.from_url(redis_server.url, health_check_interval=5)
    with pytest.raises(ValueError, match="rediss://"):
        RedisLockService.from_url(redis_server.url, ssl_ca_certs="/nonexistent.pem")
    with pytest.raises(ValueError, match="query"):
        RedisLockService.from_url(redis_server.url + "?db=2")  # the database is the path


def test_the_redis_py_adapter_takes_a_client_of_ones_own(redis_server, r):
    own = redis.Redis.from_url(redis_server.url)
    s = RedisLockService(own, direct_grants=True)
    assert isinstance(s, RedisLockService) and isinstance(s, RedisExecutor)
    assert s.backend_protocol == "redis" and s.ping() is True
    assert s.client is own and s.pool is own.connection_pool
    with LockClient(s, owns_service=False) as c:
        with c.acquire("adapter", ttl=5) as h:
            assert s.status("adapter").fencing_token == h.fencing_token
        assert c.counters().stream_opens == 0  # redis-py's connections, not the core's
    s.close()
    assert own.ping(), "a client given without owns_client stays usable"
    own.close()
    a = AsyncRedisLockService(aioredis.Redis.from_url(redis_server.url), owns_client=True)
    assert isinstance(a, AsyncRedisLockService) and isinstance(a, AsyncRedisExecutor)
    asyncio.run(a.close())
    for bad in ({"pubsub_ping_interval": 0}, {"pubsub_linger": -1}):
        with pytest.raises(ValueError):
            RedisLockService(redis.Redis.from_url(redis_server.url), **bad)


class Recording(RedisLockService):
    """A subclass of one's own wrapping the documented ``command`` extension point."""

    def __init__(self, client=None, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(client, **kw)
        self.seen: list[bytes] = []

    def command(self, argv):  # type: ignore[no-untyped-def]
        self.seen.append(bytes(argv[0]))
        return super().command(argv)


def test_a_subclass_of_ones_own_keeps_the_redis_py_path(redis_server, r):
    for s in (Recording(redis.Redis.from_url(redis_server.url), owns_client=True), Recording.from_url(redis_server.url)):
        assert isinstance(s, Recording) and isinstance(s, RedisLockService) and isinstance(s, RedisExecutor)
        assert s.backend_protocol == "redis" and s.ping() is True
        with LockClient(s) as c:
            c.acquire("sub", ttl=5).release()
        assert b"EVALSHA" in s.seen or b"EVAL" in s.seen, s.seen  # the core's requests went through it


@pytest.mark.parametrize("path", sorted(PATHS))
def test_uncontended_acquire_release_and_renewal(redis_server, r, path):
    with LockClient(PATHS[path](redis_server.url)) as c:
        with c.acquire("solo", ttl=1.0) as h:
            assert h.is_held()
            assert holder_of(r, "solo")[0] == h.fencing_token  # type: ignore[index]
            wait_for(lambda: c.counters().renewals_ok >= 2, what="two renewals")
            assert h.is_held() and not h.lost.is_set()
        assert not r.exists(keys_for("solo").lock), "released on the server when release() returned"
        with c.acquire("solo", ttl=1.0) as h2:
            assert h2.fencing_token > h.fencing_token


def test_many_waiters_in_one_client_queue_and_each_release_hands_over(redis_server, r):
    with LockClient(service(redis_server.url)) as holder, LockClient(service(redis_server.url)) as c:
        h = holder.acquire("q", ttl=120.0)
        ws = [Acquirer(c, "q", ttl=10.0, wait=60.0) for _ in range(4)]
        for w in ws:
            w.start()
        wait_for(lambda: r.zcard(keys_for("q").queue) == 4, what="one queue entry per waiting lease")
        h.release()
        fences = []
        done: set[int] = set()
        for _ in ws:
            # 120 s holder TTL, 60 s waits: only wake-ups can hand the lock over in time.
            def next_holder():  # type: ignore[no-untyped-def]
                return next((w for w in ws if id(w) not in done and w.handle is not None), None)

            wait_for(lambda: next_holder() is not None or any(w.error for w in ws), timeout=60, what="next holder")
            nxt = next_holder()
            assert nxt is not None, [w.error for w in ws]
            fences.append(nxt.handle.fencing_token)
            done.add(id(nxt))
            nxt.handle.release()
        for w in ws:
            w.join(60)
            assert w.error is None, w.error
        assert len(fences) == 4 and fences == sorted(fences) and len(set(fences)) == 4
        assert fences[0] > h.fencing_token
        wait_for(lambda: r.zcard(keys_for("q").queue) == 0, what="an empty queue")


@pytest.mark.parametrize("path", sorted(PATHS))
def test_status_reports_holder_ttl_and_last_fence_and_refuses_garbage(redis_server, r, path):
    with LockClient(PATHS[path](redis_server.url)) as c:
        svc = c.service
        st = svc.status("jobs")  # while the service drives a client: a sibling reads it
        assert (st.held, st.fencing_token, st.remaining_ttl_ms, st.last_fencing_token) == (False, None, None, None)
        h = c.acquire("jobs", ttl=30.0)
        st = svc.status("jobs")
        assert st.held and st.fencing_token == h.fencing_token == st.last_fencing_token
        assert 0 < st.remaining_ttl_ms <= 30_000 and st.holder_pid is None and st.holder_host is None
        h.release()
        st = svc.status("jobs")
        assert not st.held and st.last_fencing_token == h.fencing_token
        r.set(keys_for("bad").lock, "x")
        with pytest.raises(ProtocolError) as e:
            svc.status("bad")
        print("status of a garbage key:", e.value)
        assert c.acquire("after", ttl=5.0).release() == "released", "the client is unaffected"


def test_a_stopped_server_is_a_prompt_error_not_a_hang(redis_factory):
    srv = redis_factory()
    with LockClient(service(srv.url, socket_timeout=0.3, socket_connect_timeout=0.3)) as c:
        c.acquire("a", ttl=5.0).release()
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises((errors.BackendUnavailable, errors.LockTimeout)):
                c.acquire("b", ttl=5.0, wait=0)
            print(f"acquire against a stopped server failed after {time.monotonic() - t0:.2f}s")
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        c.acquire("c", ttl=5.0, wait=30).release()


@pytest.mark.parametrize("persistence", [False, True], ids=["no-persistence", "aof"])
def test_holder_loses_its_lease_when_redis_dies_and_reacquires_after_restart(redis_factory, persistence):
    srv = redis_factory(persistence=persistence)
    with LockClient(service(srv.url, socket_timeout=0.3, socket_connect_timeout=0.3)) as c:
        h = c.acquire("job", ttl=1.0)
        first = h.fencing_token
        srv.kill()
        assert h.lost.wait(60), "the holder must learn it lost the lock"
        assert not h.is_held()
        with pytest.raises(errors.LockTimeout):
            c.acquire("job", ttl=1.0, wait=0.5)  # Redis is down: bounded, then an error
        srv.start()
        h2 = c.acquire("job", ttl=1.0, wait=30.0)
        assert h2.fencing_token > first, "fencing tokens never go backwards across a restart"
        h2.release()


def test_async_clients_on_the_async_service_hand_over(redis_server, r):
    async def main() -> None:
        own = aioredis.Redis.from_url(redis_server.url)
        async with AsyncRedisLockService(own, owns_client=True, direct_grants=True) as a_svc:
            async with AsyncLockClient(a_svc) as a, AsyncLockClient(
                AsyncRedisLockService.from_url(redis_server.url)
            ) as b:
                assert await a_svc.ping() is True
                h = await a.acquire("aio", ttl=120.0)
                task = asyncio.ensure_future(b.acquire("aio", ttl=5.0, wait=60.0))
                while r.zcard(keys_for("aio").queue) != 1:
                    await asyncio.sleep(0.01)
                assert await h.release() == "released"
                h2 = await asyncio.wait_for(task, 90)  # 120 s TTL: only the wake-up does this
                assert h2.fencing_token > h.fencing_token
                await h2.release()
                assert not r.exists(keys_for("aio").lock)

    asyncio.run(asyncio.wait_for(main(), 120))

"""LockClient / AsyncLockClient on Redis in one process: handoff through the waiters queue and
pub/sub, missed
notifications survived by the retry hint and backoff, garbage keys, and a Redis restart.

The bounds below are chosen so that a test can only pass through the mechanism it names: e.g.
the holder's TTL (120 s) exceeds the waiter's budget (60 s), so a waiter that got no release
notification would time out rather than pass by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import polling  # noqa: E402

from leasehold import LockClient, errors
from leasehold.aio import AsyncLockClient
from leasehold.backends import redis_protocol as proto
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService


def service(url: str, **kw) -> RedisLockService:  # type: ignore[no-untyped-def]
    kw.setdefault("socket_timeout", 1.0)
    kw.setdefault("socket_connect_timeout", 1.0)
    return RedisLockService.from_url(url, **kw)


class DeafRedisLockService(RedisLockService):
    """Claims notifications but never delivers one: every waiter must rely on the retry hint."""

    def watch(self, name, on_released):  # type: ignore[no-untyped-def]
        pass

    def watch_waiter(self, name, on_wake):  # type: ignore[no-untyped-def]
        pass


class Acquirer(threading.Thread):
    def __init__(self, client: LockClient, name: str, ttl: float, wait: float) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.ttl, self.wait = client, name, ttl, wait
        self.handle = None
        self.error: BaseException | None = None
        self.started_waiting = threading.Event()

    def run(self) -> None:
        self.started_waiting.set()
        try:
            self.handle = self.client.acquire(self.name, ttl=self.ttl, wait=self.wait)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def wait_for(pred, timeout: float = 30.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    polling.wait_until(pred, timeout, 0.01, what)


def hand_over(h, w: Acquirer) -> None:  # type: ignore[no-untyped-def]
    """Release ``h`` and check that the waiting ``w`` got the lock with a higher fencing token."""
    h.release()
    w.join(90)
    assert w.error is None, w.error
    assert w.handle is not None and w.handle.fencing_token > h.fencing_token


def queued(r, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The wake channels of the entries queued for ``name``, oldest first (a protocol-3 entry
    is one lease's: ``wake#token``)."""
    return [m.decode().split("#", 1)[0] for m in r.zrange(proto.keys_for(name).waiters, 0, -1)]


def queued_tokens(r, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The ownership tokens of the leases queued for ``name`` (protocol-3 entries), oldest first."""
    return [m.decode().split("#", 1)[1] for m in r.zrange(proto.keys_for(name).waiters, 0, -1) if b"#" in m]


def test_uncontended_acquire_release_and_renewal_on_redis(redis_server, r):
    with LockClient(service(redis_server.url)) as c:
        with c.acquire("solo", ttl=1.0) as h:
            assert h.is_held()
            k = proto.keys_for("solo")
            assert int(r.hget(k.lock, "fence")) == h.fencing_token
            wait_for(lambda: c.counters().renewals_ok >= 2, what="two renewals")
            assert h.is_held() and not h.lost.is_set()
        assert not r.exists(proto.keys_for("solo").lock), "released on the server when release() returned"
        with c.acquire("solo", ttl=1.0) as h2:
            assert h2.fencing_token > h.fencing_token


def test_handoff_through_pubsub(redis_server, r):
    holder = LockClient(service(redis_server.url))
    waiter_svc = service(redis_server.url)
    waiter_client = LockClient(waiter_svc)
    try:
        h = holder.acquire("handoff", ttl=120.0)
        w = Acquirer(waiter_client, "handoff", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: queued(r, "handoff") == [waiter_svc.wake_channel], what="the waiter queued")
        assert r.pubsub_numsub(waiter_svc.wake_channel)[0][1] == 1
        assert r.pubsub_numsub(proto.keys_for("handoff").channel)[0][1] == 0, "waiters do not hear every release"
        hand_over(h, w)
        w.handle.release()
    finally:
        waiter_client.close()
        holder.close()


def serving_thread(svc: RedisLockService) -> object:
    """Who serves the service's pub/sub connection right now: a parked waiter's thread ident,
    or the pub/sub thread's marker."""
    return svc._sub._lead


def test_a_parked_waiter_reads_its_own_wake_up_and_gives_the_connection_back(redis_server, r):
    holder = LockClient(service(redis_server.url))
    waiter_svc = service(redis_server.url)
    waiter_client = LockClient(waiter_svc)
    woken_on: list[threading.Thread] = []
    woken = waiter_client._woken

    def spy(name: str, notice: object = None) -> bool:
        woken_on.append(threading.current_thread())
        return woken(name, notice)

    waiter_client._woken = spy  # type: ignore[method-assign]
    heard: list[str] = []
    try:
        h = holder.acquire("own-wake", ttl=120.0)
        w = Acquirer(waiter_client, "own-wake", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: queued(r, "own-wake") == [waiter_svc.wake_channel], what="the waiter queued")
        wait_for(lambda: serving_thread(waiter_svc) == w.ident, what="the waiter serving the connection")
        # The confirmed wake channel also woke the waiter to re-check; that attempt may still
        # be in flight, and if it reached Redis after the release below it would win without
        # a wake-up. Wait until it was answered.
        wait_for(lambda: waiter_client._inflight == 0, what="the waiter's re-check answered")
        woken_on.clear()
        hand_over(h, w)
        # The wake-up was read and handled by the waiting thread itself, not the pub/sub thread.
        assert woken_on == [w], woken_on
        # Done waiting, it gave the connection back: the pub/sub thread serves on_release.
        wait_for(lambda: serving_thread(waiter_svc) != w.ident, what="the connection given back")
        waiter_client.on_release("own-wake", heard.append)
        # A confirmed subscription delivers one notification of its own (a release may have
        # been missed before it); count only what the release brings after it.
        wait_for(lambda: heard, what="the subscription's own notification")
        heard.clear()
        w.handle.release()
        wait_for(lambda: heard == ["own-wake"], what="the release notification")
    finally:
        waiter_client.close()
        holder.close()


def test_close_while_a_parked_waiter_serves_the_connection(redis_server, r):
    holder = LockClient(service(redis_server.url))
    waiter_svc = service(redis_server.url)
    waiter_client = LockClient(waiter_svc)
    try:
        holder.acquire("close-parked", ttl=120.0)
        w = Acquirer(waiter_client, "close-parked", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: serving_thread(waiter_svc) == w.ident, what="the waiter serving the connection")
        thread = waiter_svc._sub._thread
        waiter_client.close()
        w.join(30)
        assert not w.is_alive()
        assert isinstance(w.error, errors.ClientClosed), w.error
        assert thread is not None
        thread.join(10)
        assert not thread.is_alive(), "the pub/sub thread ended"
    finally:
        waiter_client.close()
        holder.close()


def test_connection_lost_under_a_parked_waiter_is_reconnected(redis_server, r):
    """The pub/sub connection dies while a parked waiter serves it. Either the waiter's read
    fails and it hands the failure to the pub/sub thread, which reconnects, or redis-py's own
    retry inside a read reconnects and re-subscribes (a kill during the subscriber's
    non-blocking poll): both end with the wake channel subscribed on a new connection, the
    waiter (still queued, re-checked on the confirmation) serving it, and the handoff working."""
    with LockClient(service(redis_server.url)) as holder:
        waiter_svc = service(redis_server.url)
        with LockClient(waiter_svc) as c:
            h = holder.acquire("lost-parked", ttl=120.0)
            w = Acquirer(c, "lost-parked", ttl=10.0, wait=60.0)
            w.start()
            wait_for(lambda: queued(r, "lost-parked") == [waiter_svc.wake_channel], what="the waiter queued")
            wait_for(lambda: serving_thread(waiter_svc) == w.ident, what="the waiter serving the connection")
            served = waiter_svc._sub._conn
            assert served is not None
            host, port = served.ps.connection._sock.getsockname()
            # Exactly this connection: a kill by type could hit only a stale one of another test.
            assert r.client_kill_filter(addr=f"{host}:{port}") == 1
            wait_for(lambda: r.pubsub_numsub(waiter_svc.wake_channel)[0][1] == 1, what="re-subscribed")
            wait_for(lambda: serving_thread(waiter_svc) == w.ident, what="the waiter serving again")
            hand_over(h, w)
            w.handle.release()


def test_an_interrupt_while_a_waiter_serves_the_connection_reaches_the_caller(redis_server, r, monkeypatch):
    """KeyboardInterrupt inside the parked waiter's read (Ctrl-C in a main thread that waits)
    reaches acquire()'s caller, cancels that acquire, and the pub/sub thread reconnects (a
    reply may have been cut in half), so the next waiter is still woken."""
    from leasehold.backends import redis as redis_backend

    holder = LockClient(service(redis_server.url))
    waiter_svc = service(redis_server.url)
    waiter_client = LockClient(waiter_svc)
    interrupt_in: list[int] = []
    real_wait = redis_backend._Subscriber._wait

    def wait(self, timeout, sock=None):  # type: ignore[no-untyped-def]
        if sock is not None and threading.get_ident() in interrupt_in:
            interrupt_in.clear()
            raise KeyboardInterrupt
        return real_wait(self, timeout, sock)

    monkeypatch.setattr(redis_backend._Subscriber, "_wait", wait)
    try:
        h = holder.acquire("interrupted", ttl=120.0)
        w = Acquirer(waiter_client, "interrupted", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: serving_thread(waiter_svc) == w.ident, what="the waiter serving the connection")
        interrupt_in.append(w.ident)
        waiter_svc.unpark()  # a poke: its select returns, and its next one is interrupted
        w.join(30)
        assert isinstance(w.error, KeyboardInterrupt), w.error
        wait_for(lambda: waiter_svc.subscriber_reconnects >= 1, what="a reconnect")
        assert serving_thread(waiter_svc) != w.ident
        w2 = Acquirer(waiter_client, "interrupted", ttl=10.0, wait=60.0)
        w2.start()
        wait_for(lambda: queued(r, "interrupted") == [waiter_svc.wake_channel], what="the next waiter queued")
        hand_over(h, w2)
        w2.handle.release()
    finally:
        waiter_client.close()
        holder.close()


def test_many_waiters_in_one_client_queue_one_entry_each_and_all_get_the_lock(redis_server, r):
    svc = service(redis_server.url)
    with LockClient(service(redis_server.url)) as holder, LockClient(svc) as c:
        h = holder.acquire("q", ttl=120.0)
        ws = [Acquirer(c, "q", ttl=10.0, wait=60.0) for _ in range(4)]
        for w in ws:
            w.start()
        wait_for(lambda: len(queued(r, "q")) == 4, what="the waiters queued")
        assert queued(r, "q") == [svc.wake_channel] * 4, "one entry per waiting lease, on its client's channel"
        assert len(set(queued_tokens(r, "q"))) == 4
        h.release()
        fences = []
        done: set[int] = set()
        for _ in ws:
            # Each release wakes the next waiter (120 s TTLs: only notifications can do this).
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
        assert c._grant_notices >= 3, "each release granted the next waiter directly"
        assert queued(r, "q") == []


def test_each_release_wakes_only_the_oldest_waiting_client(redis_server, r):
    svcs = [service(redis_server.url) for _ in range(4)]
    clients = [LockClient(s) for s in svcs]
    try:
        with LockClient(service(redis_server.url)) as holder:
            h = holder.acquire("one", ttl=120.0)
            ws = []
            for c, s in zip(clients, svcs):
                w = Acquirer(c, "one", ttl=10.0, wait=60.0)
                w.start()
                # Queued, and past its quick attempts (the core's QUICK_ATTEMPTS = 3): parked
                # until the holder's 120 s TTL hint unless a release wakes it.
                wait_for(
                    lambda: s.wake_channel in queued(r, "one") and c.counters().acquires_sent >= 3,
                    what="the waiter parked in the queue",
                )
                ws.append(w)
            assert queued(r, "one") == [s.wake_channel for s in svcs], "first come, first queued"
            sent = [c.counters().acquires_sent for c in clients]
            h.release()
            fences = [h.fencing_token]
            for i, w in enumerate(ws):
                w.join(60)
                assert w.error is None and w.handle is not None, w.error
                fences.append(w.handle.fencing_token)
                # Only the client a release picked tried again (120 s holder TTLs: no timer did).
                later = [c.counters().acquires_sent for c in clients[i + 1 :]]
                assert later == sent[i + 1 :], f"release {i} woke more than one client"
                w.handle.release()
            assert fences == sorted(fences) and len(set(fences)) == 5
            wait_for(lambda: queued(r, "one") == [], what="an empty queue")
    finally:
        for c in clients:
            c.close()


@contextlib.contextmanager
def stale_entry(url: str, kind: str) -> Iterator[str]:
    """A wake channel that must not swallow a wake-up: one nobody subscribes to (PUBLISH
    reaches 0 clients), that of a live sync / asyncio service that waited once and no longer
    does (it passes the wake-up on with NOTIFY), or that of an asyncio service whose client's
    core no longer waits although the service still counts it as waiting."""
    if kind == "dead":
        yield proto.new_wake_channel()
    elif kind == "not-waiting":
        other = service(url)
        try:
            other.watch_waiter("elsewhere", lambda _n: False)
            other.unwatch_waiter("elsewhere")
            yield other.wake_channel
        finally:
            other.close()
    else:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        def run(coro):  # type: ignore[no-untyped-def]
            return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

        aother = AsyncRedisLockService.from_url(url)
        aclient = AsyncLockClient(aother)
        try:
            if kind == "async-not-waiting":
                run(aother.watch_waiter("elsewhere", lambda _n: None))
                run(aother.unwatch_waiter("elsewhere"))
            else:
                # The service still counts the client as waiting for the name, but its core
                # no longer waits (the gap between the core's Unwatch and the service's
                # unwatch_waiter): the client answers False on its loop and the service
                # passes the wake-up on.
                async def bound_then_registered() -> None:
                    async with await aclient.acquire("bind-the-loop", ttl=5.0):
                        pass
                    await aother.watch_waiter("stale", aclient._woken)

                run(bound_then_registered())
            yield aother.wake_channel
        finally:
            run(aclient.close())
            run(aother.close())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


@pytest.mark.parametrize("stale", ["dead", "not-waiting", "async-not-waiting", "async-core-not-waiting"])
def test_a_stale_queue_entry_does_not_swallow_the_wake_up(redis_server, r, stale):
    waiter_svc = service(redis_server.url)
    with stale_entry(redis_server.url, stale) as entry, LockClient(
        service(redis_server.url)
    ) as holder, LockClient(waiter_svc) as c:
        if stale != "dead":
            assert r.pubsub_numsub(entry)[0][1] == 1, "the wake channel stays subscribed"
        h = holder.acquire("stale", ttl=120.0)
        w = Acquirer(c, "stale", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: queued(r, "stale") == [waiter_svc.wake_channel], what="the waiter queued")
        r.zadd(proto.keys_for("stale").waiters, {entry: 0})  # ahead of the real waiter
        h.release()
        w.join(90)
        assert w.error is None and w.handle is not None, w.error
        assert queued(r, "stale") == [], "the winner's entry went with its grant"
        w.handle.release()
        assert queued(r, "stale") == []


def test_missed_notifications_are_survived_by_the_retry_hint(redis_server, r):
    with LockClient(service(redis_server.url)) as holder, LockClient(
        DeafRedisLockService.from_url(redis_server.url)
    ) as deaf:
        h = holder.acquire("deaf", ttl=2.0)
        w = Acquirer(deaf, "deaf", ttl=5.0, wait=60.0)
        w.start()
        wait_for(lambda: deaf.counters().acquires_sent >= 1, what="a first attempt")
        h.release()  # published, but the deaf waiter never hears it
        w.join(90)
        assert w.error is None, w.error
        assert w.handle is not None and w.handle.fencing_token > h.fencing_token
        w.handle.release()


def test_subscriber_connection_killed_as_the_holder_releases(redis_server, r):
    with LockClient(service(redis_server.url)) as holder, LockClient(service(redis_server.url)) as c:
        h = holder.acquire("killed", ttl=3.0)
        w = Acquirer(c, "killed", ttl=5.0, wait=60.0)
        w.start()
        k = proto.keys_for("killed")
        wait_for(lambda: queued(r, "killed"), what="the waiter queued")
        # Kill every subscriber connection and release in one atomic step, so the wake-up is
        # certainly lost (its queue entry is popped). The holder's core then releases
        # (NotOwner: gone).
        token = r.hget(k.lock, "token").decode()
        pipe = r.pipeline(transaction=True)
        pipe.client_kill_filter(_type="pubsub")
        pipe.evalsha(proto.script(proto.SCRIPT_RELEASE).sha, 2, k.lock, k.waiters, token, k.channel, "killed")
        r.script_load(proto.script(proto.SCRIPT_RELEASE).text)
        killed, released = pipe.execute()
        assert killed >= 1 and released == 1
        assert queued(r, "killed") == []
        w.join(90)
        assert w.error is None, w.error
        assert w.handle is not None and w.handle.fencing_token > h.fencing_token
        w.handle.release()
        h.release()


def test_garbage_keys_fail_the_acquire_with_a_clear_error(redis_server, r, caplog):
    caplog.set_level(logging.WARNING, logger="leasehold")
    r.set(proto.keys_for("bad").lock, "not a lock")
    r.set(proto.keys_for("badfence").fence, "hello")
    with LockClient(service(redis_server.url)) as c:
        for name in ("bad", "badfence"):
            with pytest.raises(errors.LockTimeout):
                c.acquire(name, ttl=1.0, wait=0.3)
    text = caplog.text
    assert "lh: lock key lh:{bad} holds a string" in text
    assert 'lh: fence key lh:{badfence}:fence holds "hello"' in text
    assert r.get(proto.keys_for("bad").lock) == b"not a lock"
    assert not r.exists(proto.keys_for("badfence").lock)


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


def test_async_client_on_the_async_service(redis_server, r):
    """Handoff between asyncio clients. The waiting client also subscribes to the name's
    releases and hears this one once: the wake-up that picks it goes to its waiter only."""

    async def main() -> None:
        b_svc = AsyncRedisLockService.from_url(redis_server.url)
        heard: list[str] = []
        async with AsyncLockClient(AsyncRedisLockService.from_url(redis_server.url)) as a, AsyncLockClient(b_svc) as b:
            b.on_release("aio", heard.append)
            # A confirmed subscription delivers one notification (a release may have been
            # missed before it): wait for it, then count only what the release brings.
            while not heard:
                await asyncio.sleep(0.01)
            heard.clear()
            h = await a.acquire("aio", ttl=120.0)
            task = asyncio.ensure_future(b.acquire("aio", ttl=5.0, wait=60.0))
            while queued(r, "aio") != [b_svc.wake_channel]:
                await asyncio.sleep(0.01)
            await h.release()
            h2 = await asyncio.wait_for(task, 90)
            assert h2.fencing_token > h.fencing_token
            while not heard:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # a second callback, if any, would have come by now
            assert heard == ["aio"]
            await h2.release()
            assert not r.exists(proto.keys_for("aio").lock)

    asyncio.run(asyncio.wait_for(main(), 120))


"""A wake-up read by another thread than the woken waiter's: that thread sends the waiter's
ACQUIRE itself (``RedisLockService.send_acquire``) and the waiter only reads the reply.

Setup of every test: one shared ``LockClient``; a first waiter ``L`` (on another name) serves
the client's pub/sub connection (a parked waiter claims it), and the waiter ``W`` under test
waits on ``name`` without it, so ``W``'s wake-up is read on ``L``'s thread. The holder lives
in a separate client; its TTLs (120 s) exceed every wait, so only the wake-up can hand over.
The services keep to protocol 2 (``direct_grants=False``): with a direct grant a handoff needs
no ACQUIRE at all, and the pre-sent attempt serves the wake-ups of protocol-2 releasers.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import polling  # noqa: E402

from leasehold import Config, LockClient  # noqa: E402
from leasehold.backends import redis_protocol as proto  # noqa: E402
from leasehold.backends.redis import RedisLockService  # noqa: E402
from leasehold.service import Granted, LockService  # noqa: E402
from test_redis_lockclient import Acquirer, queued  # noqa: E402


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    polling.wait_until(pred, timeout, 0.01, what)


def redis_client(url: str, retries: int = 1) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), retries), socket_keepalive=True
    )


def no_connection_left_out(client: redis.Redis) -> None:
    """After the service's close: every connection went back to the pool (the watch worker's
    last unwatch may still be running when close() returns, hence the wait)."""
    pool = client.connection_pool
    try:
        wait_for(lambda: not pool._in_use_connections, timeout=10.0, what="every connection back in the pool")
    finally:
        client.close()


class Calls:
    """Records the service calls of interest: (thread ident, token) per call."""

    def __init__(self) -> None:
        self.sent_ahead: list[tuple[int, str]] = []
        self.acquired: list[tuple[int, str]] = []
        self.reads = 0

    def clear(self) -> None:
        self.sent_ahead.clear()
        self.acquired.clear()
        self.reads = 0


def spy(svc: RedisLockService, calls: Calls, after_send: Callable[[], None] | None = None) -> None:
    """Record ``svc``'s acquire and send_acquire calls (before a LockClient reads them)."""
    real_acquire, real_send = svc.acquire, svc.send_acquire

    def acquire(name: str, token: str, ttl_ms: int, *tag: int):  # type: ignore[no-untyped-def]
        calls.acquired.append((threading.get_ident(), token))
        return real_acquire(name, token, ttl_ms, *tag)

    def send_acquire(name: str, token: str, ttl_ms: int, *tag: int):  # type: ignore[no-untyped-def]
        calls.sent_ahead.append((threading.get_ident(), token))
        read = real_send(name, token, ttl_ms, *tag)
        if after_send is not None:
            after_send()
        if read is None:
            return None

        def counted():  # type: ignore[no-untyped-def]
            calls.reads += 1
            return read()

        return counted

    svc.acquire = acquire  # type: ignore[method-assign]
    svc.send_acquire = send_acquire  # type: ignore[method-assign]


class Setup:
    """Holder client (holds ``name`` and ``other``), shared client ``c`` with the serving waiter
    ``L`` on ``other`` and the waiter ``W`` on ``name``, settled (nothing in flight)."""

    def __init__(self, url: str, r: redis.Redis, name: str, svc: LockService, w_wait: float = 60.0, **kw: Any) -> None:
        self.r = r
        self.name = name
        self.holder = LockClient(RedisLockService(redis_client(url), owns_client=True, direct_grants=False))
        self.svc = svc
        self.c = LockClient(svc, **kw)
        self.h = self.holder.acquire(name, ttl=120.0)
        self.h_other = self.holder.acquire(name + "-other", ttl=120.0)
        inner = svc if isinstance(svc, RedisLockService) else svc.inner  # type: ignore[attr-defined]
        self.L = Acquirer(self.c, name + "-other", ttl=10.0, wait=60.0)
        self.L.start()
        wait_for(lambda: inner._sub._lead == self.L.ident, what="L serving the connection")
        self.W = Acquirer(self.c, name, ttl=10.0, wait=w_wait)
        self.W.start()
        wait_for(lambda: queued(r, name) == [inner.wake_channel], what="W queued")
        # W's first attempt ran on its own thread; the watch's re-check may follow, and each
        # waiter makes its quick attempts (the core's QUICK_ATTEMPTS = 3) on short backoffs
        # before it sleeps until the holder's 120 s TTL hint: let all of that end, or a retry
        # of W's own could win the handoff instead of the wake-up under test.
        horizon_ns = w_wait / 3 * 1e9

        def settled() -> bool:
            dl = self.c._deadline
            quiet = dl is None or dl - self.c._now() > horizon_ns
            return quiet and self.c.wait_idle(0.05) and self.c._side_pending == 0

        wait_for(settled, what="the client settled, no timer due soon")
        assert inner._sub._lead == self.L.ident, "L still serves the connection"

    def close(self) -> None:
        self.c.close()
        self.holder.close()


def test_a_handoff_between_two_threads_sends_the_waiters_attempt_ahead(redis_server, r):
    svc = RedisLockService(redis_client(redis_server.url), owns_client=True, direct_grants=False)
    calls = Calls()
    spy(svc, calls)
    s = Setup(redis_server.url, r, "ahead", svc)
    try:
        calls.clear()
        presends = s.c._presends
        s.h.release()
        s.W.join(30)
        assert s.W.error is None, s.W.error
        assert s.W.handle is not None and s.W.handle.fencing_token > s.h.fencing_token
        # The attempt was sent on L's thread (which read the wake-up), and W only read it.
        assert [i for i, _ in calls.sent_ahead] == [s.L.ident], calls.sent_ahead
        assert calls.reads == 1
        assert calls.acquired == [], "W did not send an attempt of its own"
        assert s.c._presends == presends + 1
        assert s.L.is_alive() and s.L.handle is None, "L still waits"
        s.W.handle.release()
    finally:
        s.close()


@pytest.mark.parametrize("retries", [1, 0], ids=["redis-py-retry", "no-retry"])
def test_a_failed_read_of_the_attempt_sent_ahead_is_retried_and_the_waiter_acquires(redis_server, r, retries):
    """The reply of the pre-sent ACQUIRE is lost (the connection fails under the read). With a
    redis-py retry the reader re-sends at once; without one it is the core's transport error,
    and the core's own retry re-sends. ACQUIRE is idempotent for W's token: W gets the one
    grant the lost reply carried, and no connection is left checked out."""
    client = redis_client(redis_server.url, retries)
    svc = RedisLockService(client, direct_grants=False)  # the test owns the client: its pool is inspected after close
    calls = Calls()
    failed: list[Any] = []

    def fail_the_next_read() -> None:
        # The connection send() popped is the last one given back (LIFO); patched after the
        # send, so only the read fails.
        conn = sent_on[0]

        def read_response(*a: Any, **kw: Any) -> Any:
            del conn.read_response  # once
            failed.append(conn)
            conn.disconnect()  # the reply is gone with the socket
            raise redis.ConnectionError("injected: connection lost under the read")

        conn.read_response = read_response

    sent_on: list[Any] = []
    real_send = svc._direct.send  # type: ignore[union-attr]

    def send(packed: bytes, packed_eval: Any) -> Any:
        sent_on[:] = svc._direct._free[-1:]  # type: ignore[union-attr]
        return real_send(packed, packed_eval)

    svc._direct.send = send  # type: ignore[method-assign,union-attr]
    spy(svc, calls, after_send=lambda: fail_the_next_read() if armed else None)
    armed = False
    s = Setup(redis_server.url, r, f"lost-read-{retries}", svc)
    try:
        calls.clear()
        sent_before = s.c.counters().acquires_sent
        armed = True
        s.h.release()
        s.W.join(30)
        assert s.W.error is None, s.W.error
        assert len(failed) == 1, "the injected read failure happened"
        assert calls.reads == 1
        assert s.W.handle is not None
        assert s.W.handle.fencing_token > s.h.fencing_token
        # The grant W holds is the one Redis keeps (the retry found its own grant).
        k = proto.keys_for(s.name)
        assert int(r.hget(k.lock, "fence")) == int(r.get(k.fence)) == s.W.handle.fencing_token
        if retries:
            assert s.c.counters().acquires_sent == sent_before + 1, "re-sent by the service"
        else:
            assert s.c.counters().acquires_sent == sent_before + 2, "re-sent by the core"
        s.W.handle.release()
    finally:
        s.close()
    no_connection_left_out(client)


def test_a_waiter_that_leaves_while_its_attempt_is_sent_ahead_gets_its_reply_read_once(redis_server, r):
    """W is interrupted (KeyboardInterrupt, as Ctrl-C in a waiting main thread) while L is
    still sending W's ACQUIRE (held up in the test's spy until W has left). The grant that
    ACQUIRE brings must still be read and fed exactly once: the core then releases it (W gave
    up), long before a lost reply's request timeout (20 s here) could; no result is stale (fed
    twice), nothing stays in flight, and no connection stays out of the pool."""
    client = redis_client(redis_server.url)
    svc = RedisLockService(client, direct_grants=False)
    calls = Calls()
    interrupt = threading.Event()
    w_box: list[Acquirer] = []
    real_park = svc.park

    def park(ready: threading.Event, timeout: float) -> bool:
        if threading.current_thread().name != "left":  # an Acquirer's thread is named after its lock
            return real_park(ready, timeout)
        end = time.monotonic() + timeout
        while not ready.wait(0.01):
            if interrupt.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= end:
                return False
        return True

    def hold_up() -> None:
        if w_box:
            interrupt.set()
            w_box[0].join(20)  # W leaves meanwhile

    svc.park = park  # type: ignore[method-assign]
    spy(svc, calls, after_send=hold_up)
    s = Setup(redis_server.url, r, "left", svc, config=Config(request_timeout_ns=20_000_000_000))
    try:
        calls.clear()
        stale_before = s.c.counters().stale_results
        presends = s.c._presends
        w_box.append(s.W)
        s.h.release()
        s.W.join(20)
        assert isinstance(s.W.error, KeyboardInterrupt), s.W.error
        # The reply goes to a thread that reads it and feeds the grant; the core releases it.
        k = proto.keys_for("left")
        wait_for(lambda: not r.exists(k.lock), timeout=8.0, what="W's late grant released")
        wait_for(lambda: s.c.wait_idle(0.05), timeout=8.0, what="the client settled")
        assert [i for i, _ in calls.sent_ahead] == [s.L.ident]
        assert calls.reads == 1
        assert calls.acquired == []
        assert s.c._inflight == 0
        counters = s.c.counters()
        assert counters.stale_results == stale_before, "no result was fed twice"
        assert counters.pending_cleanups == 0
        assert s.c._presends == presends, "W had left: nobody took the pre-sent reply over"
        assert int(r.get(k.fence)) > s.h.fencing_token, "W's attempt was granted (and released)"
        assert s.L.is_alive() and s.L.handle is None, "L still waits"
    finally:
        s.close()
    no_connection_left_out(client)


class PlainService(LockService):
    """A RedisLockService without the capability: everything else delegated."""

    def __init__(self, inner: RedisLockService) -> None:
        self.inner = inner
        self.notifications = inner.notifications
        self.wakes_one_waiter = inner.wakes_one_waiter
        self.call_timeout = inner.call_timeout

    def acquire(self, name, token, ttl_ms):  # type: ignore[no-untyped-def]
        return self.inner.acquire(name, token, ttl_ms)

    def renew(self, name, token, ttl_ms, backend_data):  # type: ignore[no-untyped-def]
        return self.inner.renew(name, token, ttl_ms, backend_data)

    def release(self, name, token, backend_data):  # type: ignore[no-untyped-def]
        return self.inner.release(name, token, backend_data)

    def watch(self, name, on_released):  # type: ignore[no-untyped-def]
        self.inner.watch(name, on_released)

    def unwatch(self, name):  # type: ignore[no-untyped-def]
        self.inner.unwatch(name)

    def watch_waiter(self, name, on_wake):  # type: ignore[no-untyped-def]
        self.inner.watch_waiter(name, on_wake)

    def unwatch_waiter(self, name):  # type: ignore[no-untyped-def]
        self.inner.unwatch_waiter(name)

    def park(self, ready, timeout):  # type: ignore[no-untyped-def]
        return self.inner.park(ready, timeout)

    def unpark(self):  # type: ignore[no-untyped-def]
        self.inner.unpark()

    def end_park(self):  # type: ignore[no-untyped-def]
        self.inner.end_park()

    def close(self):  # type: ignore[no-untyped-def]
        self.inner.close()


def test_without_the_capability_the_waiter_sends_its_own_attempt(redis_server, r):
    inner = RedisLockService(redis_client(redis_server.url), owns_client=True, direct_grants=False)
    calls = Calls()
    spy(inner, calls)
    svc = PlainService(inner)
    assert not hasattr(svc, "send_acquire")
    s = Setup(redis_server.url, r, "plain", svc)
    try:
        calls.clear()
        s.h.release()
        s.W.join(30)
        assert s.W.error is None, s.W.error
        assert s.W.handle is not None and s.W.handle.fencing_token > s.h.fencing_token
        # The wake-up was read on L's thread, the attempt sent and read on W's own.
        assert calls.sent_ahead == []
        assert [i for i, _ in calls.acquired] == [s.W.ident], calls.acquired
        assert s.c._presends == 0
        assert s.c._send_acquire is None
        s.W.handle.release()
    finally:
        s.close()



def test_send_acquire_keeps_its_connection_out_until_the_reply_is_read(redis_server, r):
    """The service side: the pre-sent request's connection is nobody else's until its reply is
    read (another call meanwhile takes another connection and gets its own answer), NOSCRIPT is
    answered by EVAL on the same connection, and without an idle connection nothing is sent."""
    svc = RedisLockService(redis_client(redis_server.url), owns_client=True, direct_grants=False)
    d = svc._direct
    assert d is not None
    try:
        assert svc.send_acquire("sa-a", "a" * 32, 5_000) is None, "no idle connection: nothing sent, no connect"
        assert isinstance(svc.acquire("sa-warm", "c" * 32, 5_000), Granted)  # one idle connection now
        r.script_flush()  # the pre-sent EVALSHA meets NOSCRIPT
        read = svc.send_acquire("sa-a", "a" * 32, 5_000)
        assert read is not None
        assert d._free == [], "the connection with a reply pending is out of the free list"
        # Another call meanwhile: its own connection, its own answer.
        b = svc.acquire("sa-b", "b" * 32, 5_000)
        a = read()
        assert isinstance(a, Granted) and isinstance(b, Granted)
        assert a.fencing_token == int(r.hget(proto.keys_for("sa-a").lock, "fence"))
        assert b.fencing_token == int(r.hget(proto.keys_for("sa-b").lock, "fence"))
        assert r.hget(proto.keys_for("sa-a").lock, "token") == b"a" * 32
        assert len(d._free) == 2, "both connections back after the read"
        assert svc.release("sa-a", "a" * 32, b"") is True
    finally:
        svc.close()


def test_a_failed_send_ahead_sends_nothing_and_gives_the_connection_back_disconnected(redis_server, r):
    """A send that fails leaves no half-sent request behind: ``None`` (the caller then runs
    ``acquire`` itself), and the connection goes back to the free list disconnected."""
    svc = RedisLockService(redis_client(redis_server.url), owns_client=True, direct_grants=False)
    d = svc._direct
    assert d is not None
    try:
        assert isinstance(svc.acquire("sf-warm", "c" * 32, 5_000), Granted)
        (conn,) = d._free
        disconnected: list[bool] = []
        real_disconnect = conn.disconnect

        def broken_send(*_a: Any, **_k: Any) -> None:
            raise redis.ConnectionError("the test broke the send")

        def disconnect(*a: Any, **k: Any) -> None:
            disconnected.append(True)
            real_disconnect(*a, **k)

        conn.send_packed_command = broken_send
        conn.disconnect = disconnect
        assert svc.send_acquire("sf-a", "a" * 32, 5_000) is None
        assert disconnected, "the connection was disconnected"
        assert d._free == [conn], "and given back"
        assert not r.exists(proto.keys_for("sf-a").lock), "nothing was sent"
        del conn.send_packed_command, conn.disconnect
        assert isinstance(svc.acquire("sf-a", "a" * 32, 5_000), Granted), "the connection works again"
    finally:
        svc.close()


def test_a_reply_sent_ahead_is_never_read_in_a_forked_child(redis_server, r):
    """The reader refuses to run in a forked child: the reply on the shared socket is the
    parent's, which then reads it itself (without a re-send)."""
    svc = RedisLockService(redis_client(redis_server.url, retries=0), owns_client=True, direct_grants=False)
    d = svc._direct
    assert d is not None
    try:
        assert isinstance(svc.acquire("fk-warm", "c" * 32, 5_000), Granted)
        read = svc.send_acquire("fk-a", "a" * 32, 5_000)
        assert read is not None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    read()
                    code = 2  # the child read the parent's reply
                except redis.ConnectionError:
                    code = 0 if d._free == [] else 3  # nor did it free the parent's connection
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        a = read()  # no retries: this is the reply sent before the fork
        assert isinstance(a, Granted)
        assert a.fencing_token == int(r.hget(proto.keys_for("fk-a").lock, "fence"))
        assert len(d._free) == 1
        assert svc.release("fk-a", "a" * 32, b"") is True
    finally:
        svc.close()

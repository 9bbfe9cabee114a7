"""RedisLockService / AsyncRedisLockService on their own (no LockClient): result mapping,
EVALSHA fallback, errors as exceptions, and the pub/sub subscriber's reconnects."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
import redis

from leasehold.backends import redis_protocol as proto
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService
from leasehold.service import AsyncLockService, Granted, HeldByOther, LockService


def tok() -> str:
    return uuid.uuid4().hex


class Notes:
    """Thread-safe collector of on_released calls."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, name: str) -> None:
        with self.cond:
            self.names.append(name)
            self.cond.notify_all()

    def wait_count(self, n: int, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.names) < n:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True


def commandstats(r: redis.Redis) -> dict[str, int]:
    info = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()}


@pytest.fixture
def svc(redis_server, r):
    s = RedisLockService.from_url(redis_server.url, pubsub_linger=0.2)
    yield s
    s.close()


def test_service_types():
    assert issubclass(RedisLockService, LockService)
    assert issubclass(AsyncRedisLockService, AsyncLockService)
    assert RedisLockService.notifications is True


def test_acquire_renew_release_map_to_the_service_interface(svc, r):
    t, other = tok(), tok()
    g = svc.acquire("jobs", t, 10_000)
    assert isinstance(g, Granted) and g.ttl_ms == 10_000 and g.fencing_token > 0
    assert svc.acquire("jobs", t, 10_000) == g, "idempotent for the same token"
    h = svc.acquire("jobs", other, 10_000)
    assert isinstance(h, HeldByOther) and h.retry_after_ms is not None and 0 < h.retry_after_ms <= 10_000
    assert svc.renew("jobs", t, 10_000, b"") is True
    assert svc.renew("jobs", other, 10_000, b"") is False
    assert svc.release("jobs", other, b"") is False
    assert svc.release("jobs", t, b"") is True
    assert svc.release("jobs", t, b"") is False
    g2 = svc.acquire("jobs", other, 10_000)
    assert isinstance(g2, Granted) and g2.fencing_token > g.fencing_token


def test_evalsha_falls_back_to_eval_once_and_then_hits_the_cache(svc, r):
    r.config_resetstat()
    svc.acquire("a", tok(), 1_000)  # the server has no scripts (the fixture flushed them)
    stats = commandstats(r)
    assert stats.get("eval") == 1 and stats.get("evalsha") == 1  # NOSCRIPT, then EVAL
    for _ in range(5):
        svc.acquire("a", tok(), 1_000)
    stats = commandstats(r)
    assert stats.get("eval") == 1 and stats.get("evalsha") == 6
    r.script_flush()
    svc.acquire("b", tok(), 1_000)
    assert commandstats(r).get("eval") == 2


def test_script_errors_are_raised_with_the_lh_message(svc, r):
    r.set("lh:{bad}", "garbage")
    with pytest.raises(redis.ResponseError, match=r"^lh: lock key lh:\{bad\} holds a string"):
        svc.acquire("bad", tok(), 1_000)
    with pytest.raises(redis.ResponseError, match="^lh: "):
        svc.renew("bad", tok(), 1_000, b"")
    with pytest.raises(redis.ResponseError, match="^lh: "):
        svc.release("bad", tok(), b"")
    assert r.get("lh:{bad}") == b"garbage"


def test_bad_arguments_are_refused_before_the_wire(svc):
    with pytest.raises(ValueError):
        svc.acquire("a", tok(), 0)
    with pytest.raises(ValueError):
        svc.acquire("", tok(), 1_000)


def test_a_dead_server_is_an_exception_promptly_not_a_hang(redis_factory):
    srv = redis_factory()
    svc = RedisLockService.from_url(srv.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        assert isinstance(svc.acquire("a", tok(), 1_000), Granted)
        srv.kill()
        for call in (
            lambda: svc.acquire("a", tok(), 1_000),
            lambda: svc.renew("a", tok(), 1_000, b""),
            lambda: svc.release("a", tok(), b""),
        ):
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                call()
        srv.start()
        assert isinstance(svc.acquire("b", tok(), 1_000), Granted), "the pool reconnects by itself"
    finally:
        svc.close()


def test_a_stopped_server_is_a_timeout_exception_not_a_hang(redis_factory):
    import os
    import signal

    srv = redis_factory()
    svc = RedisLockService.from_url(srv.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    try:
        svc.acquire("a", tok(), 1_000)
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
                svc.acquire("a", tok(), 1_000)
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        assert isinstance(svc.acquire("c", tok(), 1_000), Granted)
    finally:
        svc.close()


# ---- notifications ---------------------------------------------------------------------------
def _wait_subscribed(r: redis.Redis, channel: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if r.pubsub_numsub(channel)[0][1] >= 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"nobody subscribed to {channel}")


def test_watch_delivers_release_notifications_and_unwatch_stops_them(svc, r):
    notes = Notes()
    svc.watch("jobs", notes)
    channel = proto.keys_for("jobs").channel
    _wait_subscribed(r, channel)
    assert notes.wait_count(1), "a confirmed subscription wakes one waiter"
    t = tok()
    svc.acquire("jobs", t, 10_000)
    svc.release("jobs", t, b"")
    assert notes.wait_count(2)
    assert notes.names == ["jobs", "jobs"]
    svc.unwatch("jobs")
    end = time.monotonic() + 10
    while r.pubsub_numsub(channel)[0][1] and time.monotonic() < end:
        time.sleep(0.01)
    assert r.pubsub_numsub(channel)[0][1] == 0
    t = tok()
    svc.acquire("jobs", t, 10_000)
    svc.release("jobs", t, b"")
    r.publish(channel, "jobs")
    svc.watch("other", lambda n: None)  # proves the subscriber thread is still alive and serving
    _wait_subscribed(r, proto.keys_for("other").channel)
    assert notes.names == ["jobs", "jobs"]


def pubsub_clients(r: redis.Redis) -> int:
    return sum(1 for c in r.client_list() if int(c.get("sub", 0)) > 0 or "subscribe" in c.get("cmd", ""))


def test_a_name_watched_again_while_lingering_is_not_resubscribed_but_wakes_a_waiter(redis_server, r):
    svc = RedisLockService.from_url(redis_server.url, pubsub_linger=60.0)
    try:
        notes = Notes()
        svc.watch("jobs", notes)
        assert notes.wait_count(1)
        r.config_resetstat()
        svc.unwatch("jobs")
        svc.watch("jobs", notes)
        assert notes.wait_count(2), "a restarted watch always gets one wake-up"
        stats = commandstats(r)
        assert "subscribe" not in stats and "unsubscribe" not in stats
        t = tok()
        svc.acquire("jobs", t, 10_000)
        svc.release("jobs", t, b"")
        assert notes.wait_count(3)
    finally:
        svc.close()


def test_the_connection_is_dropped_when_nothing_is_watched_and_comes_back(svc, r):
    notes = Notes()
    svc.watch("jobs", notes)
    _wait_subscribed(r, proto.keys_for("jobs").channel)
    svc.unwatch("jobs")
    wait_until = time.monotonic() + 10
    while pubsub_clients(r) and time.monotonic() < wait_until:
        time.sleep(0.01)
    assert pubsub_clients(r) == 0
    svc.watch("jobs", notes)
    _wait_subscribed(r, proto.keys_for("jobs").channel)
    t = tok()
    svc.acquire("jobs", t, 10_000)
    svc.release("jobs", t, b"")
    assert notes.wait_count(3)


def test_the_subscriber_reconnects_after_client_kill_and_resubscribes(svc, r):
    notes = Notes()
    svc.watch("jobs", notes)
    channel = proto.keys_for("jobs").channel
    _wait_subscribed(r, channel)
    assert notes.wait_count(1)
    killed = r.client_kill_filter(_type="pubsub")
    assert killed >= 1
    # Re-subscribed: the confirmation wakes a waiter again (messages may have been missed)...
    assert notes.wait_count(2)
    _wait_subscribed(r, channel)
    # ...and real notifications flow again.
    t = tok()
    svc.acquire("jobs", t, 10_000)
    svc.release("jobs", t, b"")
    assert notes.wait_count(3)


def test_the_subscriber_survives_a_server_restart(redis_factory):
    srv = redis_factory()
    svc = RedisLockService.from_url(srv.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        notes = Notes()
        svc.watch("jobs", notes)
        assert notes.wait_count(1)
        srv.kill()
        time.sleep(0.2)  # let the subscriber notice and retry against the dead port
        srv.start()
        assert notes.wait_count(2, timeout=20), "re-subscribed after the restart"
        t = tok()
        assert isinstance(svc.acquire("jobs", t, 10_000), Granted)
        assert svc.release("jobs", t, b"") is True
        assert notes.wait_count(3)
        assert svc.subscriber_reconnects >= 1
    finally:
        svc.close()


def test_close_stops_the_subscriber_thread(redis_server, r):
    svc = RedisLockService.from_url(redis_server.url)
    svc.watch("jobs", lambda n: None)
    _wait_subscribed(r, proto.keys_for("jobs").channel)
    svc.close()
    end = time.monotonic() + 10
    while any(t.name == "leasehold-redis-pubsub" for t in threading.enumerate()) and time.monotonic() < end:
        time.sleep(0.01)
    assert not any(t.name == "leasehold-redis-pubsub" for t in threading.enumerate())
    assert r.pubsub_numsub(proto.keys_for("jobs").channel)[0][1] == 0
    svc.close()  # idempotent


# ---- asyncio twin ------------------------------------------------------------------------------
def test_async_service_maps_results_and_notifies(redis_server, r):
    async def main() -> None:
        svc = AsyncRedisLockService.from_url(redis_server.url, pubsub_linger=0.2)
        notes = Notes()
        try:
            t, other = tok(), tok()
            g = await svc.acquire("jobs", t, 10_000)
            assert isinstance(g, Granted)
            assert await svc.acquire("jobs", t, 10_000) == g
            h = await svc.acquire("jobs", other, 10_000)
            assert isinstance(h, HeldByOther) and h.retry_after_ms and h.retry_after_ms > 0
            assert await svc.renew("jobs", t, 10_000, b"") is True
            assert await svc.renew("jobs", other, 10_000, b"") is False
            await svc.watch("jobs", notes)
            while not notes.names:
                await asyncio.sleep(0.01)
            assert await svc.release("jobs", other, b"") is False
            assert await svc.release("jobs", t, b"") is True
            while len(notes.names) < 2:
                await asyncio.sleep(0.01)
            # reconnect after CLIENT KILL, then a notification still arrives
            assert r.client_kill_filter(_type="pubsub") >= 1
            while len(notes.names) < 3:
                await asyncio.sleep(0.01)
            t3 = tok()
            await svc.acquire("jobs", t3, 10_000)
            await svc.release("jobs", t3, b"")
            while len(notes.names) < 4:
                await asyncio.sleep(0.01)
            assert set(notes.names) == {"jobs"}
            r.set("lh:{bad}", "x")
            with pytest.raises(redis.ResponseError, match="^lh: lock key"):
                await svc.acquire("bad", tok(), 1_000)
            await svc.unwatch("jobs")
            # after the linger the connection is closed; a new watch opens one again
            while r.pubsub_numsub(proto.keys_for("jobs").channel)[0][1]:
                await asyncio.sleep(0.01)
            n = len(notes.names)
            await svc.watch("jobs", notes)
            while len(notes.names) <= n:
                await asyncio.sleep(0.01)
            t4 = tok()
            await svc.acquire("jobs", t4, 10_000)
            await svc.release("jobs", t4, b"")
            while len(notes.names) <= n + 1:
                await asyncio.sleep(0.01)
        finally:
            await svc.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_status_reports_holder_ttl_and_last_fence(svc, r):
    st = svc.status("jobs")
    assert (st.held, st.fencing_token, st.remaining_ttl_ms, st.last_fencing_token) == (False, None, None, None)
    t = tok()
    g = svc.acquire("jobs", t, 30_000)
    st = svc.status("jobs")
    assert st.held and st.fencing_token == g.fencing_token == st.last_fencing_token
    assert 0 < st.remaining_ttl_ms <= 30_000 and st.holder_pid is None
    svc.release("jobs", t, b"")
    st = svc.status("jobs")
    assert not st.held and st.last_fencing_token == g.fencing_token
    assert svc.ping() is True
    r.set(proto.keys_for("bad").lock, "x")
    with pytest.raises(proto.ProtocolError, match="^lh: lock key"):
        svc.status("bad")
    r.set(proto.keys_for("bad2").fence, "hello")
    with pytest.raises(proto.ProtocolError, match="^lh: "):
        svc.status("bad2")


def test_a_forked_child_gets_its_own_subscriber(svc, r):
    import os

    notes = Notes()
    svc.watch("parent", notes)
    assert notes.wait_count(1)
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread does not exist here
        code = 1
        try:
            child_notes = Notes()
            svc.watch("child", child_notes)
            # The child's own subscriber confirms its SUBSCRIBE with one wake-up; only then is
            # a PUBLISH sure to reach it (released before that, the notification is lost).
            if not child_notes.wait_count(1, timeout=20):
                os._exit(3)
            t = tok()
            svc.acquire("child", t, 10_000)
            svc.release("child", t, b"")
            code = 0 if child_notes.wait_count(2, timeout=20) else 2
            svc.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    t = tok()
    svc.acquire("parent", t, 10_000)
    svc.release("parent", t, b"")
    assert notes.wait_count(2), "the parent's subscriber is unaffected"


@pytest.mark.parametrize("kw", [{"decode_responses": True}, {"protocol": 2}, {"protocol": 3}], ids=str)
def test_client_options_do_not_change_results(redis_server, r, kw):
    svc = RedisLockService.from_url(redis_server.url, pubsub_linger=0.2, **kw)
    try:
        notes = Notes()
        svc.watch("opt", notes)
        assert notes.wait_count(1)
        t = tok()
        g = svc.acquire("opt", t, 5_000)
        assert isinstance(g, Granted) and isinstance(g.fencing_token, int)
        assert isinstance(svc.acquire("opt", tok(), 5_000), HeldByOther)
        st = svc.status("opt")
        assert st.held and st.fencing_token == g.fencing_token
        assert svc.renew("opt", t, 5_000, b"") is True
        assert svc.release("opt", t, b"") is True
        assert notes.wait_count(2) and notes.names == ["opt", "opt"]
    finally:
        svc.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_pub_sub_pushes_skip_redis_pys_push_handler(redis_server, monkeypatch, protocol):
    """With RESP3 a pub/sub message is a push: it goes through our pass-through handler, not
    redis-py's default one (which formats each and offers it to a debug logger). RESP2 has
    no push handler, and the service works without one."""
    from leasehold.backends import redis as redis_backend

    pushed: list[object] = []
    monkeypatch.setattr(redis_backend, "_push_as_is", lambda resp: pushed.append(resp) or resp)
    svc = RedisLockService.from_url(redis_server.url, protocol=protocol)
    try:
        notes = Notes()
        svc.watch("push", notes)
        assert notes.wait_count(1)
        t = tok()
        assert isinstance(svc.acquire("push", t, 5_000), Granted)
        assert svc.release("push", t, b"") is True
        assert notes.wait_count(2) and notes.names == ["push", "push"]
        if protocol == 3:
            assert len(pushed) >= 2, pushed  # the subscription's confirmation and the release
        else:
            assert pushed == []
    finally:
        svc.close()


def test_call_timeout_is_bounded_only_with_socket_timeouts(redis_server, svc):
    # from_url sets socket timeouts, so LockClient may run the caller's own calls inline.
    bound = svc.call_timeout
    assert bound is not None and 0 < bound <= 60
    # A client without socket timeouts can block for ever: no bound, no inline calls.
    bare = RedisLockService(redis.Redis.from_url(redis_server.url), owns_client=True)
    try:
        assert bare.call_timeout is None
    finally:
        bare.close()


def test_packed_commands_are_the_bytes_redis_py_would_send():
    conn = redis.Connection()
    name = "caf\u00e9/r\u00e9sum\u00e9"
    k, w, t = proto.keys_for(name), proto.wire_for(name), tok()
    for by_text in (False, True):
        def ref(kind: int, nkeys: int, *args: object) -> bytes:
            s = proto.script(kind)
            head = ("EVAL", s.text) if by_text else ("EVALSHA", s.sha)
            return b"".join(conn.pack_command(*head, nkeys, *args))

        assert proto.pack_acquire(w, t, 1234, by_text) == ref(proto.SCRIPT_ACQUIRE, 2, k.lock, k.fence, t, 1234)
        assert proto.pack_renew(w, t, 99, by_text) == ref(proto.SCRIPT_RENEW, 1, k.lock, t, 99)
        wake = proto.new_wake_channel()
        assert proto.pack_acquire(w, t, 1234, by_text, wake) == ref(
            proto.SCRIPT_ACQUIRE, 3, k.lock, k.fence, k.waiters, t, 1234, wake
        )
        assert proto.pack_release(w, t, by_text) == ref(proto.SCRIPT_RELEASE, 2, k.lock, k.waiters, t, k.channel, name)
        assert proto.pack_release(w, t, by_text, wake) == ref(
            proto.SCRIPT_RELEASE, 2, k.lock, k.waiters, t, k.channel, name, wake
        )
    # The packers check a usual TTL inline and anything else with ttl_arg: both must refuse.
    for bad in (0, -1, True, 1.5, "10", None):
        with pytest.raises(ValueError):
            proto.pack_acquire(w, t, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            proto.pack_acquire(w, t, bad, False, "lh:wake:x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            proto.pack_renew(w, t, bad)  # type: ignore[arg-type]


def test_reply_parsers_accept_the_usual_replies_and_refuse_everything_else():
    # The usual replies take an inline fast path; what it does not accept must still meet
    # the full checks, with the same results and errors as before.
    assert proto.parse_acquire([1, 7, 1000]) == Granted(fencing_token=7, ttl_ms=1000)
    assert proto.parse_acquire([0, 250]) == HeldByOther(retry_after_ms=250)
    assert proto.parse_acquire([0, -1]) == HeldByOther(retry_after_ms=None)
    assert proto.parse_acquire((1, 7, 1000)) == Granted(fencing_token=7, ttl_ms=1000)
    for bad in (
        [1, 0, 1000],
        [1, 7, 0],
        [1, -7, 1000],
        [True, 7, 1000],
        [1, True, 1000],
        [1, 7, b"1000"],
        [0, "250"],
        [0, 250, 1],
        [2, 250],
        [1, 7],
        [],
        None,
        1,
        b"OK",
    ):
        with pytest.raises(proto.ProtocolError):
            proto.parse_acquire(bad)
    assert proto.parse_flag(1, "RENEW") is True
    assert proto.parse_flag(0, "RELEASE") is False
    for bad_flag in (2, -1, True, False, b"1", "1", None, [1]):
        with pytest.raises(proto.ProtocolError):
            proto.parse_flag(bad_flag, "RENEW")


def test_queue_entries_know_which_entry_a_release_or_an_unwatch_must_drop():
    q = proto.QueueEntries()
    assert q.stale_entry("n", waiting=False, wake="lh:wake:me") is None, "never queued"
    q.sent("n")
    q.answered("n", granted=True)
    assert not q.gave_up("n"), "a winner stays queued for its own RELEASE to drop"
    assert q.stale_entry("n", waiting=True, wake="lh:wake:me") is None, "still waiting here"
    assert q.stale_entry("n", waiting=False, wake="lh:wake:me") == "lh:wake:me"
    assert q.stale_entry("n", waiting=False, wake="lh:wake:me") is None, "dropped once"
    q.sent("m")
    q.answered("m", granted=False)
    assert q.gave_up("m") and not q.gave_up("m"), "a refused attempt's entry is removed once"
    assert q.stale_entry("m", waiting=False, wake="lh:wake:me") is None


def test_a_wake_up_counts_as_taken_unless_declined_unregistered_or_the_callback_fails(caplog):
    got: list[str] = []

    def failing(_name: str) -> bool:
        raise RuntimeError("callback bug")

    assert proto.offer_wake(lambda n: got.append(n), "n"), "None: taken (the client cannot tell)"
    assert proto.offer_wake(lambda n: True, "n")
    assert not proto.offer_wake(lambda n: False, "n"), "declined: pass it on"
    assert not proto.offer_wake(None, "n"), "nobody waits here"
    with caplog.at_level("ERROR", logger="leasehold.redis"):
        assert not proto.offer_wake(failing, "n")
    assert got == ["n"] and "callback failed for 'n'" in caplog.text


def test_direct_path_reuses_one_connection_and_gives_it_back_on_close(redis_server, r):
    svc = RedisLockService.from_url(redis_server.url)
    pool = svc.client.connection_pool
    try:
        assert svc._direct is not None
        for _ in range(5):
            t = tok()
            assert isinstance(svc.acquire("reuse", t, 5_000), Granted)
            assert svc.release("reuse", t, b"") is True
        assert len(svc._direct._free) == 1 and len(pool._in_use_connections) == 1
    finally:
        svc.close()
    assert not svc._direct._free


def test_direct_path_survives_a_killed_connection(redis_server, r):
    svc = RedisLockService.from_url(redis_server.url)
    try:
        t = tok()
        assert isinstance(svc.acquire("killed-conn", t, 5_000), Granted)
        r.client_kill_filter(skipme=True)  # every connection but r's, the service's included
        # The stale socket fails once; the connection's retry reconnects and the call succeeds.
        assert svc.renew("killed-conn", t, 5_000, b"") is True
        assert svc.release("killed-conn", t, b"") is True
    finally:
        svc.close()


@pytest.mark.parametrize("kwargs", [{"single_connection_client": True}, {"encoding": "latin-1"}])
def test_clients_the_direct_path_does_not_cover_take_redis_pys_path(redis_server, r, kwargs):
    svc = RedisLockService(redis.Redis.from_url(redis_server.url, **kwargs), owns_client=True)
    try:
        assert svc._direct is None
        t = tok()
        assert isinstance(svc.acquire("generic", t, 5_000), Granted)
        assert svc.release("generic", t, b"") is True
    finally:
        svc.close()


def test_a_forked_child_does_not_share_the_parents_direct_connection(svc, r):
    import os

    t = tok()
    assert isinstance(svc.acquire("fork-direct", t, 10_000), Granted)  # the parent's connection
    parent_conn = svc._direct._free[-1]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ct = tok()
            ok = isinstance(svc.acquire("fork-direct-child", ct, 10_000), Granted)
            ok = ok and svc.release("fork-direct-child", ct, b"") is True
            ok = ok and parent_conn not in svc._direct._free
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert svc.renew("fork-direct", t, 10_000, b"") is True
    assert svc._direct._free == [parent_conn], "the parent's socket was neither closed nor replaced"
    assert svc.release("fork-direct", t, b"") is True


def test_messages_arriving_together_are_all_delivered(svc, r):
    # Several notifications in one TCP read: the ones left in redis-py's buffer (invisible to
    # select) must be delivered at once, not at the next unrelated wake-up.
    notes = Notes()
    svc.watch("burst", notes)
    assert notes.wait_count(1)  # the SUBSCRIBE confirmation
    pipe = r.pipeline(transaction=False)
    for _ in range(5):
        pipe.publish(proto.keys_for("burst").channel, "burst")
    pipe.execute()
    assert notes.wait_count(6, timeout=5.0), notes.names


def test_async_direct_path_reuses_one_connection_survives_a_kill_and_gives_it_back(redis_server, r):
    import redis.asyncio as aioredis

    async def main() -> None:
        svc = AsyncRedisLockService.from_url(redis_server.url)
        try:
            assert svc._direct is not None
            for _ in range(5):
                t = tok()
                assert isinstance(await svc.acquire("a-reuse", t, 5_000), Granted)
                assert await svc.release("a-reuse", t, b"") is True
            assert len(svc._direct._free) == 1
            t = tok()
            assert isinstance(await svc.acquire("a-killed", t, 5_000), Granted)
            r.client_kill_filter(skipme=True)  # the service's connection too
            assert await svc.renew("a-killed", t, 5_000, b"") is True
            assert await svc.release("a-killed", t, b"") is True
        finally:
            await svc.close()
        assert not svc._direct._free
        bare = AsyncRedisLockService(aioredis.Redis.from_url(redis_server.url, single_connection_client=True), owns_client=True)
        try:
            assert bare._direct is None
            t = tok()
            assert isinstance(await bare.acquire("a-generic", t, 5_000), Granted)
            assert await bare.release("a-generic", t, b"") is True
        finally:
            await bare.close()

    asyncio.run(asyncio.wait_for(main(), 60))

"""``RedisStreamExecutor``: the core owns the Redis connections and the executor only moves
bytes (standard-library sockets), against a real redis-server: a lock with its fencing token,
a release waking a waiter of another client through the subscriber (every read fed with its
drain, in one crossing), a server restart, the
client name and database from the options and the URL, URLs the core refuses, and an acquire
that never left (no connection opened) leaving nothing for close."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from leasehold import LockClient, errors
from leasehold.backends.redis_stream import RedisStreamExecutor

from lh_feeds import count_feeds
from lh_redis_server import free_port


def _lock_key(r, name: str) -> bytes:
    keys = [k for k in r.keys("lh:{" + name + "}*") if b"fence" not in k and b"queue" not in k]
    assert len(keys) <= 1, keys
    return keys[0] if keys else b""


def test_acquire_fence_release(redis_server, r) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    with LockClient(RedisStreamExecutor(url, client_name="lh-py-stream")) as client:
        with client.acquire("py-stream", ttl=5, wait=5) as lock:
            assert lock.fencing_token > int(r.time()[0]) * 1_000_000 - 60_000_000
            assert _lock_key(r, "py-stream")
            # The commands and the subscriber streams (the subscriber opens beside the grant).
            deadline = time.monotonic() + 5
            while [c.get("name") for c in r.client_list()].count("lh-py-stream") < 2:
                assert time.monotonic() < deadline, r.client_list()
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while _lock_key(r, "py-stream") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _lock_key(r, "py-stream")
        assert client.backend_counters()["subscribed"] == 1
        # One open per connection, none ended.
        k = client.counters()
        assert (k.stream_opens, k.stream_closes, k.stream_late_answers, k.sentinel_lookups) == (2, 0, 0, 0), k


def test_a_release_wakes_a_waiter_of_another_client(redis_server, r) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    with LockClient(RedisStreamExecutor(url)) as a, LockClient(RedisStreamExecutor(url)) as b:
        # Every read, the poller thread's (the wake-up) and the caller's, reaches the core in
        # one crossing with its drain.
        alone, drained = count_feeds(b._core)
        held = a.acquire("py-handoff", ttl=10)
        got: list[float] = []

        def wait() -> None:
            with b.acquire("py-handoff", ttl=10, wait=8) as lock:
                got.append(time.monotonic())
                assert lock.fencing_token > held.fencing_token

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.5)
        assert not got
        released = time.monotonic()
        held.release()
        t.join(10)
        assert got and got[0] - released < 2.0  # woken, not the 10 s idle recheck
        assert b.backend_counters()["wakeups"] >= 1
        assert not alone and len(drained) >= 3, (alone, drained)  # connected, subscribed, woken


def test_the_client_reconnects_after_a_restart(redis_factory) -> None:
    srv = redis_factory()
    with LockClient(RedisStreamExecutor(f"redis://127.0.0.1:{srv.port}/3")) as client:
        with client.acquire("py-restart-1", ttl=5):
            pass
        srv.restart()
        with client.acquire("py-restart-2", ttl=5, wait=10) as lock:
            assert lock.fencing_token > 0
            assert srv.client(db=3).exists(*srv.client(db=3).keys("lh:{py-restart-2}*"))
        # Both connections ended with the server; the commands one was opened again (the
        # subscriber's reopen may still be on its way).
        k = client.counters()
        assert k.stream_closes >= 2 and k.stream_opens >= 3, k
        assert 1 <= k.stream_opens - k.stream_closes <= 2, k


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://127.0.0.1:26379", "redis+cluster://127.0.0.1:7000/3", "http://x", "redis://h:0"],
)
def test_urls_the_core_refuses(url: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        LockClient(RedisStreamExecutor(url))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("unix://redis.sock", "absolute socket path"),
        ("http://127.0.0.1", "redis://"),
        ("redis://:hunter2@127.0.0.1:6379/x", "database"),
    ],
)
def test_a_refused_url_says_why(url: str, reason: str) -> None:
    # lh_client_new has no handle to hold a detail: the core's reason comes from
    # lh_client_new_check, never showing the password.
    with pytest.raises(errors.InvalidArgument) as e:
        LockClient(RedisStreamExecutor(url))
    assert e.value.status_name == "LH_ERR_INVALID_CONFIG", e.value
    assert reason in str(e.value), e.value
    assert "hunter2" not in str(e.value), e.value


def _hanging_port() -> tuple[socket.socket, list[socket.socket]]:
    """A loopback port whose connects hang: a listener with a full backlog that never
    accepts (the kernel drops the next handshakes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fill = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(srv.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    return srv, fill


@pytest.mark.parametrize("down", ["refused", "hanging"])
def test_an_acquire_that_never_left_leaves_nothing_for_close(down: str, caplog: pytest.LogCaptureFixture) -> None:
    """No connection opens (refused, or a connect that hangs past the request timeout): the
    acquire fails, and since its request was never written, no cleanup release is owed, so
    close() has nothing to wait for (it would wait out its timeout and warn)."""
    if down == "refused":
        port, held = free_port(), None
    else:
        held = _hanging_port()
        port = held[0].getsockname()[1]
    client = LockClient(RedisStreamExecutor(f"redis://127.0.0.1:{port}/0"))
    try:
        with pytest.raises(errors.LockTimeout):
            client.acquire("never-left", ttl=5, wait=0.2)
        assert "request failed" in client.backend_last_error(), client.backend_last_error()
        assert client.counters().pending_cleanups == 0
    finally:
        client.close()
        if held is not None:
            for s in [held[0], *held[1]]:
                s.close()
    assert not [r for r in caplog.records if "gave up" in r.getMessage()], caplog.text

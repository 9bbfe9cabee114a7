"""The Redis executor (the core speaks the protocol, redis-py runs it) on a real redis-server.

Handoff cost, idle cost, a frozen waiter at the head of the queue, garbage keys, a killed
pub/sub connection, a restart, a killed holder, connection options, and the asyncio twin.
Measured numbers (delays, script calls) are printed; bounds are generous (noisy machines).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from leasehold import AsyncLockClient, LockClient, errors
from leasehold.backends.redis_executor import RedisExecutor
from leasehold.backends.redis_executor_async import AsyncRedisExecutor
from lh_keys import holder_of

PKG = Path(__file__).resolve().parents[2]


def wait_until(pred: Any, timeout: float = 10.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def queued(r: redis.Redis, name: str) -> int:
    return int(r.zcard(f"lh:{{{name}}}:queue"))


@pytest.fixture
def script_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PKG), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def clients(r: redis.Redis):  # type: ignore[no-untyped-def]
    made: list[LockClient] = []

    def make(**kw: Any) -> LockClient:
        c = LockClient(RedisExecutor(r), **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_lifecycle_renew_and_release_outcomes(r, clients):  # type: ignore[no-untyped-def]
    c = clients()
    h = c.acquire("life", ttl=10)
    assert h.is_held() and h.fencing_token > 0
    before = h.valid_until
    time.sleep(0.01)
    assert h.renew() > before
    assert h.release() == "released"
    assert not r.exists("lh:{life}")
    h2 = c.acquire("life", ttl=10)
    assert h2.fencing_token > h.fencing_token
    r.delete("lh:{life}")  # the grant vanished on the server
    assert h2.release() == "not_owner"
    h3 = c.acquire("life", ttl=10)
    r.delete("lh:{life}")
    with pytest.raises(errors.LockLost):
        h3.renew()
    assert h3.lost.is_set()


def test_contention_between_clients_excludes_and_fences_increase(r, clients):  # type: ignore[no-untyped-def]
    cs = [clients() for _ in range(4)]
    inside = [0]
    fences: list[int] = []
    bad: list[str] = []
    mu = threading.Lock()

    def work(c: LockClient) -> None:
        for _ in range(25):
            with c.acquire("busy", ttl=10, wait=30) as h:
                with mu:
                    inside[0] += 1
                    if inside[0] != 1:
                        bad.append("two holders")
                    fences.append(h.fencing_token)
                time.sleep(0.001)
                with mu:
                    inside[0] -= 1

    ts = [threading.Thread(target=work, args=(c,)) for c in cs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not bad
    assert len(fences) == 100
    assert fences == sorted(fences) and len(set(fences)) == 100


def _chain(r: redis.Redis, clients: Any, name: str, waiters: int) -> tuple[int, int, list[float]]:
    """A holder and ``waiters`` queued clients; each takes the lock in turn. Returns the
    script calls from the moment all are queued to the last release, and the handoff delays."""
    holder = clients()
    ws = [clients() for _ in range(waiters)]
    holder.acquire(name + "-warm", ttl=10).release()  # loads the scripts (NOSCRIPT is not a handoff cost)
    h = holder.acquire(name, ttl=10)
    got: list[float] = []
    released_at: list[float] = []
    mu = threading.Lock()

    def wait(c: LockClient) -> None:
        lock = c.acquire(name, ttl=10, wait=60)
        with mu:
            got.append(time.monotonic())
        time.sleep(0.02)
        with mu:
            released_at.append(time.monotonic())
        lock.release()

    ts = []
    for i, c in enumerate(ws):
        ts.append(threading.Thread(target=wait, args=(c,)))
        ts[-1].start()
        wait_until(lambda: queued(r, name) == i + 1, what=f"{i + 1} queued")
    before = script_calls(r)
    released_at.append(time.monotonic())
    h.release()
    for t in ts:
        t.join(60)
    after = script_calls(r)
    delays = [g - s for g, s in zip(sorted(got), sorted(released_at))]
    return after - before, waiters, delays


def test_commands_per_handoff_between_queued_waiters(r, clients):  # type: ignore[no-untyped-def]
    calls, handoffs, delays = _chain(r, clients, "handoff", 6)
    # Each handoff: the RELEASE and the woken waiter's ACQUIRE; then the last RELEASE.
    print(f"\nscript calls for {handoffs} handoffs: {calls} ({(calls - 1) / handoffs:.2f} per handoff); "
          f"delays ms: {[round(d * 1000, 2) for d in delays]}")
    assert calls <= 2 * handoffs + 1


def test_idle_waiters_cost_at_most_a_tenth_of_a_command_per_second(r, clients):  # type: ignore[no-untyped-def]
    holder = clients()
    ws = [clients() for _ in range(4)]
    h = holder.acquire("idle", ttl=30)
    ts = [threading.Thread(target=lambda c=c: c.acquire("idle", ttl=5, wait=60).release()) for c in ws]
    for i, t in enumerate(ts):
        t.start()
        wait_until(lambda: queued(r, "idle") == i + 1, what="queued")
    time.sleep(0.2)
    start = [c.backend_counters()["requests"] for c in ws]
    window = 5.0
    time.sleep(window)
    sent = sum(c.backend_counters()["requests"] - s for c, s in zip(ws, start))
    rate = sent / window / len(ws)
    print(f"\nidle waiters: {sent} requests from {len(ws)} waiters in {window}s ({rate:.3f}/s each)")
    assert rate <= 0.1
    h.release()
    for t in ts:
        t.join(30)


FROZEN_WAITER = """
import sys
from leasehold import LockClient
from leasehold.backends.redis_executor import RedisExecutor
c = LockClient(RedisExecutor(url=sys.argv[1]))
print("READY", flush=True)
h = c.acquire(sys.argv[2], ttl=10, wait=60)
print("ACQUIRED", flush=True)
h.release()
c.close()
"""


def test_a_frozen_waiter_at_the_head_does_not_keep_the_lock_free(redis_server, r, clients, script_env):  # type: ignore[no-untyped-def]
    holder, live = clients(), clients()
    h = holder.acquire("frozen", ttl=10)
    wait_until(lambda: holder.backend_counters()["subscribed"] == 1, what="the holder subscribed")
    wait_until(lambda: live.backend_counters()["subscribed"] == 1, what="the live waiter subscribed")
    before = set(r.pubsub_channels())
    env = dict(script_env)
    proc = subprocess.Popen([sys.executable, "-c", FROZEN_WAITER, redis_server.url, "frozen"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        wait_until(lambda: queued(r, "frozen") == 1, what="the frozen waiter queued")
        # Frozen with its subscriber socket open: a PUBLISH to it counts as delivered.
        wait_until(lambda: bool(set(r.pubsub_channels()) - before), what="the frozen waiter subscribed")
        os.kill(proc.pid, signal.SIGSTOP)  # its subscriber socket stays open
        got: list[float] = []
        t = threading.Thread(target=lambda: (live.acquire("frozen", ttl=10, wait=30), got.append(time.monotonic())))
        t.start()
        wait_until(lambda: queued(r, "frozen") == 2, what="the live waiter queued")
        t0 = time.monotonic()
        h.release()
        t.join(30)
        assert got, "the live waiter never got the lock"
        delay = got[0] - t0
        print(f"\nfrozen waiter at the head: the live waiter got the lock {delay * 1000:.1f} ms after the release")
        assert delay < 2.0
        assert live.backend_counters()["standby_takeovers"] >= 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize("garbage", ["string", "hash-without-token", "list"])
def test_garbage_under_a_lock_name_is_an_error_never_a_grant(r, clients, garbage):  # type: ignore[no-untyped-def]
    key = "lh:{junk}"
    if garbage == "string":
        r.set(key, "not a lock")
    elif garbage == "hash-without-token":
        r.hset(key, "something", "else")
        r.expire(key, 60)
    else:
        r.rpush(key, "a", "b")
    dump = r.dump(key)
    c = clients()
    with pytest.raises(errors.BackendUnavailable) as info:
        c.acquire("junk", ttl=5)
    print(f"\n{garbage}: {info.value}")
    with pytest.raises((errors.BackendUnavailable, errors.LockTimeout)):
        c.acquire("junk", ttl=5, wait=0.5)
    assert c.backend_counters()["error_replies"] >= 1
    assert r.dump(key) == dump  # untouched
    # The cleanup releases of the refused attempts keep failing on the garbage: do not wait
    # the default 5 s for them at close.
    c.close(timeout=0.2)
    assert r.dump(key) == dump


def test_a_killed_pubsub_connection_recovers(r, clients):  # type: ignore[no-untyped-def]
    a, b = clients(), clients()
    wait_until(lambda: b.backend_counters()["subscribed"] == 1, what="subscribed")
    assert r.client_kill_filter(_type="pubsub") >= 2
    wait_until(lambda: b.backend_counters()["subscriber_losses"] >= 1, what="the loss seen")
    wait_until(lambda: b.backend_counters()["subscribed"] == 1, what="subscribed again")
    h = a.acquire("pubsub", ttl=10)
    got: list[float] = []
    t = threading.Thread(target=lambda: (b.acquire("pubsub", ttl=10, wait=30).release(), got.append(time.monotonic())))
    t.start()
    wait_until(lambda: queued(r, "pubsub") == 1, what="queued")
    t0 = time.monotonic()
    h.release()
    t.join(30)
    assert got and got[0] - t0 < 2.0  # woken, not the holder's TTL
    assert b.backend_counters()["wakeups"] >= 1


def test_restart_without_persistence_keeps_fences_increasing(redis_factory):  # type: ignore[no-untyped-def]
    srv = redis_factory(persistence=False)
    c = LockClient(RedisExecutor(url=srv.url, socket_timeout=0.5, socket_connect_timeout=0.5))
    try:
        first = c.acquire("restart", ttl=5)
        f1 = first.fencing_token
        first.release()
        srv.restart()
        h = c.acquire("restart", ttl=5, wait=20)
        assert h.fencing_token > f1
        h.release()
        wait_until(lambda: c.backend_counters()["subscribed"] == 1, what="subscribed again")
    finally:
        c.close()


KILLED_HOLDER = """
import sys, time
from leasehold import LockClient
from leasehold.backends.redis_executor import RedisExecutor
c = LockClient(RedisExecutor(url=sys.argv[1]))
h = c.acquire(sys.argv[2], ttl=1.0)
print("ACQUIRED", h.fencing_token, flush=True)
time.sleep(60)
"""


def test_a_killed_holder_is_taken_over_after_its_ttl(redis_server, r, clients, script_env):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", KILLED_HOLDER, redis_server.url, "dead"], env=dict(script_env),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "ACQUIRED"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        c = clients()
        t0 = time.monotonic()
        h = c.acquire("dead", ttl=5, wait=10)
        took = time.monotonic() - t0
        print(f"\nkilled holder: taken over after {took * 1000:.0f} ms (TTL 1 s)")
        assert h.fencing_token > int(line[1])
        assert took < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_connection_options_url_db_and_acl_user(redis_server, r):  # type: ignore[no-untyped-def]
    with LockClient(RedisExecutor(url=f"redis://127.0.0.1:{redis_server.port}/3")) as c:
        with c.acquire("indb", ttl=5):
            assert redis.Redis(port=redis_server.port, db=3).exists("lh:{indb}")
            assert not r.exists("lh:{indb}")
    r.acl_setuser("lhuser", enabled=True, passwords=["+s3cret"], keys=["*"], channels=["*"], commands=["+@all"])
    try:
        ex = RedisExecutor(host="127.0.0.1", port=redis_server.port, username="lhuser", password="s3cret")
        with LockClient(ex) as c:
            assert c.acquire("acl", ttl=5).release() == "released"
        bad = RedisExecutor(host="127.0.0.1", port=redis_server.port, username="lhuser", password="wrong")
        with LockClient(bad) as c:
            with pytest.raises(errors.BackendUnavailable):
                c.acquire("acl", ttl=5)
    finally:
        r.acl_deluser("lhuser")


def test_connection_pools_refuse_ambiguous_or_foreign_arguments():  # type: ignore[no-untyped-def]
    import redis.asyncio as aredis

    from leasehold.backends.redis_connect import async_connection_pool, connection_pool

    for make, mod in ((connection_pool, "redis"), (async_connection_pool, "redis.asyncio")):
        with pytest.raises(ValueError, match="not both"):
            make(redis.Redis(), url="redis://h:1")
        with pytest.raises(TypeError, match=rf"client must be a {mod}\.Redis or ConnectionPool, not str"):
            make("redis://h:1")
    pool = async_connection_pool(url="unix:///tmp/none.sock", db=2)
    assert isinstance(pool, aredis.ConnectionPool) and pool.connection_kwargs["db"] == 2
    sync = connection_pool(unix_socket_path="/tmp/none.sock", password="pw")
    assert sync.connection_class is redis.UnixDomainSocketConnection
    assert sync.connection_kwargs["path"] == "/tmp/none.sock" and sync.connection_kwargs["password"] == "pw"


def test_one_client_per_executor(r):  # type: ignore[no-untyped-def]
    ex = RedisExecutor(r)
    with LockClient(ex, owns_service=False):
        with pytest.raises(ValueError):
            LockClient(ex)
    with LockClient(ex) as c:  # free again after close
        c.acquire("again", ttl=5).release()


def test_asyncio_executor_contention_handoff_and_outcomes(redis_server, r):  # type: ignore[no-untyped-def]
    async def main() -> None:
        cs = [AsyncLockClient(AsyncRedisExecutor(url=redis_server.url)) for _ in range(3)]
        fences: list[int] = []
        inside = [0]

        async def work(c: AsyncLockClient) -> None:
            for _ in range(15):
                h = await c.acquire("aio", ttl=10, wait=30)
                inside[0] += 1
                assert inside[0] == 1
                fences.append(h.fencing_token)
                await asyncio.sleep(0.001)
                inside[0] -= 1
                assert await h.release() == "released"

        await asyncio.gather(*(work(c) for c in cs))
        assert fences == sorted(fences) and len(set(fences)) == 45
        h = await cs[0].acquire("aio2", ttl=10)
        assert await h.renew() > 0
        r.delete("lh:{aio2}")
        assert await h.release() == "not_owner"
        assert cs[1].backend_counters()["subscribed"] == 1
        for c in cs:
            await c.close()

    asyncio.run(main())


def test_a_forked_child_leaves_the_parents_lock_alone(r, clients):  # type: ignore[no-untyped-def]
    c = clients()
    h = c.acquire("parent", ttl=2)
    holder = holder_of(r, "parent")
    pid = os.fork()
    if pid == 0:  # the child: its own core and connections; the parent's lease is not its own
        code = 1
        try:
            lost = h.lost.is_set()
            child = c.acquire("child", ttl=5)
            ok = child.release() == "released"
            code = 0 if (lost and ok) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    time.sleep(2.5)  # past the TTL: the parent kept renewing it, the child released nothing
    assert h.is_held() and holder_of(r, "parent") == holder
    assert h.release() == "released"

"""Redis Sentinel on a real topology (1 master, 1 replica, 3 sentinels: the shared
scripts/redis-sentinel-test.sh): the executor finds the master through the sentinels, and
follows a promotion with its commands and its subscriber.

Two faults, one topology each (a failover uses up the only replica):
* the master is SIGKILLed while processes contend on a name: they follow the promotion,
  the fencing gate accepts no stale write, fences never go back, acquisitions resume (the
  delay is printed, not asserted);
* a lease whose key did not reach the replica before the failover (asynchronous
  replication): its next renew finds it gone and its loss signal fires, while a lease whose
  key was replicated stays held; a newcomer's fence is higher and the gate refuses the loser.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from leasehold import AsyncLockClient, LockClient, errors
from leasehold.backends.redis_executor import RedisExecutor, parse_sentinel_url, parse_sentinels
from leasehold.backends.redis_executor_async import AsyncRedisExecutor
from leasehold.fencing import FencingGate
from lh_keys import keys_for

from lh_sentinel import SentinelTopology
from test_redis_processes import Proc


@pytest.fixture
def sentinel(redis_bin: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[SentinelTopology] = []

    def make() -> SentinelTopology:
        t = SentinelTopology(tmp_path / f"sentinel-{len(made)}")
        made.append(t)
        return t.start()

    yield make
    for t in made:
        t.stop()


@pytest.fixture
def procs():  # type: ignore[no-untyped-def]
    made: list[Proc] = []
    yield made
    for p in made:
        p.kill()


def wait_until(pred: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def test_sentinel_addresses_and_urls_are_checked() -> None:
    assert parse_sentinels("a:1, b:2,[::1]:3,c") == [("a", 1), ("b", 2), ("::1", 3), ("c", 26379)]
    assert parse_sentinel_url("redis+sentinel://:pw@h:1,h:2/main/3") == (
        [("h", 1), ("h", 2)],
        "main",
        {"password": "pw", "db": 3},
    )
    for bad in ("", "h:0", "h:x", "h:70000", ":1"):
        with pytest.raises(ValueError, match="sentinel address"):
            parse_sentinels(bad)
    for url in ("redis+sentinel://h:1", "redis+sentinel://h:1/m/x", "redis+sentinel://h:1/m/1/2", "redis://h:1/m"):
        with pytest.raises(ValueError):
            parse_sentinel_url(url)
    with pytest.raises(ValueError, match="master name"):
        RedisExecutor.from_sentinel("h:1", "")


def test_master_killed_during_contention(sentinel, tmp_path, worker_env, procs):  # type: ignore[no-untyped-def]
    t = sentinel()
    name, workers = "busy", 3
    fence_key = keys_for(name).fence
    master, replica = t.node("master"), t.node("replica")
    for _ in range(workers):
        procs.append(Proc(["loop", t.url, name, "90", str(tmp_path)], worker_env))
    wait_until(lambda: master.get(fence_key) is not None, 60, "a grant on the first master")
    time.sleep(1.0)  # contention on the first master
    assert len(master.pubsub_channels("lh:wake:*")) == workers
    before = int(master.get(fence_key))
    killed = t.kill("master")
    t.wait_promoted()
    promoted = time.monotonic() - killed
    # The first grant on the new master: acquisitions resumed. Its fence is above every fence
    # the old master handed out (a time-based fence: max(previous + 1, server TIME in µs)).
    wait_until(lambda: int(replica.get(fence_key) or 0) > before, 60, "a grant on the promoted replica")
    resumed = time.monotonic() - killed
    # Every client's subscriber followed: the wake channels are on the new master.
    wait_until(lambda: len(replica.pubsub_channels("lh:wake:*")) == workers, 30, "the subscribers on the new master")
    resubscribed = time.monotonic() - killed
    time.sleep(1.5)  # contention on the new master
    (tmp_path / "stop").touch()
    results = [p.expect("DONE", timeout=60) for p in procs]
    for p in procs:
        assert p.finish() == 0, "".join(p.err)
    print(
        f"\nsentinel failover: promoted {promoted:.2f} s after the kill, first grant on the new master "
        f"{resumed:.2f} s after it, subscribers there after {resubscribed:.2f} s; workers: {results}"
    )

    grants: list[tuple[float, int]] = []
    for f in tmp_path.glob("grants-*"):
        fences = [int(x) for x in f.read_text().split()]
        assert all(b > a for a, b in zip(fences, fences[1:])), f"{f.name}: a fence went back"
    for f in tmp_path.glob("times-*"):
        grants += [(float(line.split()[0]), int(line.split()[1])) for line in f.read_text().splitlines()]
    grants.sort()
    fences = [fence for _, fence in grants]
    assert len(fences) == len(set(fences)), "two grants shared a fence"
    # In the order the grants were received, across both masters, fences only go up.
    assert all(b > a for a, b in zip(fences, fences[1:])), "a fence went back across the failover"
    # The grant the test read as `before` may reach its worker (which times it) only after the
    # kill; every other grant timed after the kill is the new master's, and above it.
    after = [fence for at, fence in grants if at > killed and fence != before]
    assert after and min(after) > before, "grants after the kill are above the old master's fences"
    assert any(at < killed for at, _ in grants), "grants before the kill"
    rows = [tok for (tok,) in sqlite3.connect(str(tmp_path / "gate.db")).execute("SELECT token FROM writes ORDER BY rowid")]
    assert rows and all(b >= a for a, b in zip(rows, rows[1:])), "the gate accepted a stale write"
    assert max(rows) > before, "writes went on after the failover"


def _gate(path: Path) -> FencingGate:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("CREATE TABLE IF NOT EXISTS writes (token INTEGER)")
    gate = FencingGate(conn)
    gate.ensure_schema()
    return gate


def test_lease_whose_key_did_not_survive_the_failover_is_lost_on_renew(sentinel, tmp_path):  # type: ignore[no-untyped-def]
    t = sentinel()
    master, replica = t.node("master"), t.node("replica")
    opts = dict(socket_timeout=0.5, socket_connect_timeout=0.5)
    holder = LockClient(RedisExecutor(url=t.url, **opts))
    newcomer = LockClient(RedisExecutor.from_sentinel(t.sentinels, t.name, **opts))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(awaitable: Any) -> Any:
        async def wrap() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), loop).result(30)

    async def make_async() -> AsyncLockClient:
        return AsyncLockClient(AsyncRedisExecutor(url=t.url, **opts))

    aholder = run(make_async())
    try:
        kept = holder.acquire("kept", ttl=8)
        assert master.execute_command("WAIT", 1, 5000) == 1, "the replica acknowledged the kept lease"
        # The replica falls behind, deterministically: frozen, and its replication link closed
        # by the master, so what the master acknowledges now reaches no replica (no socket
        # buffer holds it either). The master dies before the replica could reconnect: the
        # writes a real failover loses when a master dies with replication lagging.
        t.signal("replica", signal.SIGSTOP)
        try:
            assert master.execute_command("CLIENT", "KILL", "TYPE", "replica") >= 1
            lost_calls: list[Any] = []
            gone = holder.acquire("gone", ttl=8, on_lost=lost_calls.append)
            agone = run(aholder.acquire("gone-async", ttl=8))
            assert master.exists(keys_for("gone").lock, keys_for("gone-async").lock) == 2
            killed = t.kill("master")
        finally:
            t.signal("replica", signal.SIGCONT)
        t.wait_promoted()
        promoted = time.monotonic() - killed
        assert replica.exists(keys_for("kept").lock) == 1, "the replicated lease's key survived"
        assert replica.exists(keys_for("gone").lock, keys_for("gone-async").lock) == 0, (
            "the unreplicated leases' keys were lost with the master"
        )
        assert gone.lost.wait(20), "the lost lease's loss signal fired"
        detected = time.monotonic() - killed
        assert run(asyncio.wait_for(agone.lost.wait(), 20)) is True
        assert gone.lost_reason == "rejected", gone.lost_reason  # its renew found the key gone
        assert agone.lost_reason == "rejected", agone.lost_reason
        assert not gone.is_held() and not agone.is_held()
        wait_until(lambda: len(lost_calls) == 1, 5, "on_lost")
        kept.renew()  # raises LockLost if its key were gone
        assert kept.is_held(), "the replicated lease is still held"
        print(f"\nsentinel: promoted {promoted:.2f} s after the kill; loss detected {detected:.2f} s after it")

        # Someone else takes the name at once (no key), with a higher fence; the gate refuses
        # the loser's write.
        newer = newcomer.acquire("gone", ttl=8, wait=10)
        assert newer.fencing_token > max(gone.fencing_token, agone.fencing_token, kept.fencing_token)
        # Every client's wake channel is on the new master (the threaded and asyncio
        # subscribers followed; the newcomer subscribed there first).
        wait_until(lambda: len(replica.pubsub_channels("lh:wake:*")) == 3, 30, "the subscribers on the new master")
        gate = _gate(tmp_path / "gate.db")
        with gate.guard("gone", newer.fencing_token) as cur:
            cur.execute("INSERT INTO writes VALUES (?)", (newer.fencing_token,))
        with pytest.raises(errors.StaleFencingToken):
            with gate.guard("gone", gone.fencing_token) as cur:
                cur.execute("INSERT INTO writes VALUES (?)", (gone.fencing_token,))
        assert newer.release() == "released"
        assert gone.release() in ("lost", "not_owner"), "the lost lease's release changes nothing"
        assert kept.release() == "released"
        assert run(agone.release()) in ("lost", "not_owner")
    finally:
        run(aholder.close())
        loop.call_soon_threadsafe(loop.stop)
        holder.close()
        newcomer.close()


def test_cli_run_on_sentinel_follows_a_failover(sentinel, worker_env):  # type: ignore[no-untyped-def]
    """``leasehold run --backend redis+sentinel://...``: a command holding the lock while the
    master is killed keeps it (its key was replicated; the renewals reach the new master)."""
    import subprocess
    import sys

    from test_redis_cli import run_cli

    t = sentinel()
    echo = ["--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    first = run_cli(["run", "jobs", "--backend", t.url, *echo], worker_env)
    assert first.returncode == 0, first.stderr
    master, replica = t.node("master"), t.node("replica")
    assert master.get(keys_for("jobs").fence) is not None, "the sentinels named the master"

    cmd = ["run", "jobs", "--ttl", "10", "--backend", t.url, "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"; sleep 5']
    p = subprocess.Popen(
        [sys.executable, "-m", "leasehold", *cmd], env=worker_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        held = int(p.stdout.readline())
        assert held > int(first.stdout)
        assert master.execute_command("WAIT", 1, 5000) == 1
        t.kill("master")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err  # not lost: renewed on the new master, released there
    t.wait_promoted()
    assert not replica.exists(keys_for("jobs").lock), "released on the new master"
    after = run_cli(["run", "jobs", "--backend", t.url, *echo], worker_env)
    assert after.returncode == 0, after.stderr
    assert int(after.stdout) > held

    status = run_cli(["status", "jobs", "--backend", t.url, "--json"], worker_env)
    assert status.returncode == 1, status  # free, asked through the new master
    assert json.loads(status.stdout)["last_fencing_token"] == int(after.stdout)
    bad = run_cli(["run", "jobs", "--backend", "redis+sentinel://127.0.0.1:1", "--", "true"], worker_env)
    assert bad.returncode == 64, bad
    gone = run_cli(["run", "jobs", "--backend", "redis+sentinel://:pw@127.0.0.1:1/x", "--", "true"], worker_env)
    assert gone.returncode == 69 and "pw" not in gone.stderr and "***" in gone.stderr, gone


def test_the_byte_path_finds_the_master_and_follows_a_failover(sentinel) -> None:  # type: ignore[no-untyped-def]
    """``RedisStreamExecutor`` on a ``redis+sentinel://`` URL: the core asks the sentinels,
    checks ``ROLE`` and follows the promotion; the host only moves bytes."""
    from leasehold.backends.redis_stream import RedisStreamExecutor

    t = sentinel()
    # A sentinel that is down comes first: the core goes on to the next.
    dead = "127.0.0.1:1"
    url = f"redis+sentinel://{dead},{t.sentinels}/{t.name}"
    with LockClient(RedisStreamExecutor(url)) as client:
        first = client.acquire("stream-failover", ttl=2)
        assert t.node("master").exists(keys_for("stream-failover").lock) == 1
        assert first.release() == "released"
        held = client.acquire("stream-held", ttl=30)
        assert t.node("master").execute_command("WAIT", 1, 5000) == 1
        t.kill("master")
        t.wait_promoted()
        # The next grant is on the promoted replica, with a higher fence.
        second = client.acquire("stream-failover", ttl=2, wait=30)
        assert second.fencing_token > first.fencing_token
        assert t.node("replica").exists(keys_for("stream-failover").lock) == 1
        assert second.release() == "released"
        held.renew()  # its key was replicated: still ours on the new master
        assert held.release() == "released"
    with pytest.raises(errors.InvalidArgument):
        LockClient(RedisStreamExecutor(f"redis+sentinel://{t.sentinels}"))  # no master name

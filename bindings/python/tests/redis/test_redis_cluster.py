"""Redis Cluster on a real cluster (3 masters, 3 replicas: the shared
scripts/redis-cluster-test.sh, started once for this module). The executor routes each
command by slot and subscribes each waited name's shard channel (``lh:{NAME}:wake``,
SSUBSCRIBE) on the master serving it.

* names in different slots (different masters) contend across processes while the master of
  one name's shard is SIGKILLed and its replica promoted: the clients follow, fences never go
  back, the fencing gate accepts no stale write, the other shard's name keeps being granted;
* a lease whose key did not reach the replica before the failover (asynchronous
  replication, on another shard): its next renew finds it gone and its loss signal fires,
  while a lease whose key was replicated stays held; a newcomer's fence is higher and the
  gate refuses the loser.
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
from leasehold.backends.redis_cluster_executor import RedisClusterExecutor, parse_cluster_url
from leasehold.backends.redis_cluster_executor_async import AsyncRedisClusterExecutor
from leasehold.fencing import FencingGate

from lh_cluster import ClusterTopology
from test_redis_processes import Proc


@pytest.fixture(scope="module")
def cluster(redis_bin: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    t = ClusterTopology(tmp_path_factory.mktemp("cluster"))
    try:
        yield t.start()
    finally:
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


def names_on_masters(t: ClusterTopology, prefix: str) -> dict[str, str]:
    """One lock name per master: master address -> name."""
    out: dict[str, str] = {}
    slots = t.slots()
    for i in range(10_000):
        name = f"{prefix}{i}"
        master, _ = t.shard_of(_lock_key(name), slots)
        out.setdefault(master, name)
        if len(out) == 3:
            return out
    raise AssertionError("names did not spread over three masters")


def _lock_key(name: str) -> bytes:
    return f"lh:{{{name}}}".encode()


def _gate(path: Path) -> FencingGate:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("CREATE TABLE IF NOT EXISTS writes (token INTEGER)")
    gate = FencingGate(conn)
    gate.ensure_schema()
    return gate


def test_cluster_urls_are_checked() -> None:
    assert parse_cluster_url("redis+cluster://u:pw@h:1,[::1]:2,h3") == (
        [("h", 1), ("::1", 2), ("h3", 6379)],
        {"username": "u", "password": "pw"},
    )
    for bad in ("redis+cluster://", "redis+cluster://h:0", "redis+cluster://h:1/0", "redis://h:1"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)
    with pytest.raises(ValueError, match="bad cluster node address 'h:x'"):
        parse_cluster_url("redis+cluster://h:x")
    with pytest.raises(ValueError, match="exactly one"):
        RedisClusterExecutor()


def test_handoffs_on_names_in_different_slots_use_their_shard_channels(cluster) -> None:  # type: ignore[no-untyped-def]
    t = cluster
    names = list(names_on_masters(t, "hand").items())
    clients = [LockClient(RedisClusterExecutor(url=t.url, socket_timeout=1)) for _ in range(2)]
    try:
        rounds, counts = 4, {name: 0 for _, name in names}
        seen_channels: set[bytes] = set()
        stop = threading.Event()

        def watch() -> None:  # the waited names' channels, on their own masters
            while not stop.is_set():
                for master, name in names:
                    try:
                        seen_channels.update(t.node(master).execute_command("PUBSUB SHARDCHANNELS", "lh:*"))
                    except Exception:
                        pass
                time.sleep(0.05)

        def work(client: LockClient, name: str) -> None:
            for _ in range(rounds):
                with client.acquire(name, ttl=5, wait=20) as lock:
                    assert lock.fencing_token > 0
                    counts[name] += 1
                    time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=work, args=(c, n)) for c in clients for _, n in names for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        stop.set()
        assert all(v == rounds * 4 for v in counts.values()), counts
        assert {f"lh:{{{n}}}:wake".encode() for _, n in names} <= seen_channels, seen_channels
        assert not any(ch.startswith(b"lh:wake:") for ch in seen_channels)
        # Nothing stays subscribed once nobody waits.
        wait_until(
            lambda: all(not t.node(m).execute_command("PUBSUB SHARDCHANNELS", "lh:*") for m, _ in names),
            10,
            "the shard channels unsubscribed",
        )
    finally:
        for c in clients:
            c.close()


def test_asyncio_executor_hands_off_on_shard_channels_and_survives_a_killed_subscriber(cluster) -> None:  # type: ignore[no-untyped-def]
    """The asyncio twin: tasks of two asyncio clients contend on names in three slots
    (fences strictly increase per name, in grant order); then a waiter's shard subscriber is
    killed by the server (``CLIENT KILL TYPE pubsub``) and the waiter still takes the lock at
    its release, long before the holder's TTL could have freed it."""
    t = cluster
    names = list(names_on_masters(t, "ahand").items())

    async def main() -> None:
        clients = [AsyncLockClient(AsyncRedisClusterExecutor(url=t.url, socket_timeout=1)) for _ in range(2)]
        try:
            fences: dict[str, list[int]] = {name: [] for _, name in names}

            async def work(client: AsyncLockClient, name: str) -> None:
                for _ in range(3):
                    async with client.acquire(name, ttl=5, wait=20) as lock:
                        fences[name].append(lock.fencing_token)
                        await asyncio.sleep(0.05)

            await asyncio.wait_for(
                asyncio.gather(*(work(c, n) for c in clients for _, n in names for _ in range(2))), 60
            )
            for name, got in fences.items():
                assert len(got) == 12 and all(b > a for a, b in zip(got, got[1:])), (name, got)

            master, name = names[0]
            holder = await clients[0].acquire(name, ttl=30)
            waiter = asyncio.ensure_future(clients[1].acquire(name, ttl=30, wait=15))
            await asyncio.sleep(0.5)  # the waiter queued and subscribed its shard channel
            channel = f"lh:{{{name}}}:wake".encode()
            assert channel in t.node(master).execute_command("PUBSUB SHARDCHANNELS", "lh:*")
            assert t.node(master).execute_command("CLIENT", "KILL", "TYPE", "pubsub") >= 1
            await asyncio.sleep(0.5)  # the core learns it and subscribes again
            start = time.monotonic()
            await holder.release()
            taken = await asyncio.wait_for(waiter, 15)
            took = time.monotonic() - start
            assert taken.fencing_token > holder.fencing_token
            assert took < 10, f"the waiter took the lock {took:.2f} s after the release"
            await taken.release()
        finally:
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_master_killed_during_contention(cluster, tmp_path, worker_env, procs):  # type: ignore[no-untyped-def]
    t = cluster
    spread = names_on_masters(t, "busy")
    (victim_master, victim), (_, other) = list(spread.items())[:2]
    _, replicas = t.shard_of(_lock_key(victim))
    fence_key = f"lh:{{{victim}}}:fence"
    dirs = {victim: tmp_path / "victim", other: tmp_path / "other"}
    for name, d in dirs.items():
        d.mkdir()
        for _ in range(2):
            procs.append(Proc(["loop", t.url, name, "90", str(d)], worker_env))
    master = t.node(victim_master)
    wait_until(lambda: master.get(fence_key) is not None, 60, "a grant on the first master")
    time.sleep(1.0)  # contention
    before = int(master.get(fence_key))
    killed = t.kill(victim_master)
    promoted_replica = None
    end = time.monotonic() + 60
    while promoted_replica is None and time.monotonic() < end:
        for rep in replicas:
            try:
                if t.node(rep).execute_command("ROLE")[0] == b"master":
                    promoted_replica = rep
            except Exception:
                pass
        time.sleep(0.05)
    assert promoted_replica, "a replica was promoted"
    t.wait_promoted(promoted_replica)
    promoted = time.monotonic() - killed
    new = t.node(promoted_replica)
    wait_until(lambda: int(new.get(fence_key) or 0) > before, 60, "a grant on the promoted replica")
    resumed = time.monotonic() - killed
    time.sleep(1.5)  # contention on the new master
    for d in dirs.values():
        (d / "stop").touch()
    results = [p.expect("DONE", timeout=60) for p in procs]
    for p in procs:
        assert p.finish() == 0, "".join(p.err)
    print(
        f"\ncluster failover: promoted {promoted:.2f} s after the kill, first grant on the new master "
        f"{resumed:.2f} s after it; workers: {results}"
    )
    for name, d in dirs.items():
        grants: list[tuple[float, int]] = []
        for f in d.glob("grants-*"):
            fences = [int(x) for x in f.read_text().split()]
            assert all(b > a for a, b in zip(fences, fences[1:])), f"{name} {f.name}: a fence went back"
        for f in d.glob("times-*"):
            grants += [(float(line.split()[0]), int(line.split()[1])) for line in f.read_text().splitlines()]
        grants.sort()
        fences = [fence for _, fence in grants]
        assert len(fences) == len(set(fences)), f"{name}: two grants shared a fence"
        assert all(b > a for a, b in zip(fences, fences[1:])), f"{name}: a fence went back"
        assert any(at < killed for at, _ in grants) and any(at > killed for at, _ in grants), name
        rows = [tok for (tok,) in sqlite3.connect(str(d / "gate.db")).execute("SELECT token FROM writes ORDER BY rowid")]
        assert rows and all(b >= a for a, b in zip(rows, rows[1:])), f"{name}: the gate accepted a stale write"
        if name == victim:
            after = [fence for at, fence in grants if at > killed]
            # >=: a grant just before the kill may be recorded just after it (fences are
            # strictly increasing in grant order, checked above).
            assert min(after) >= before, "grants after the kill are not below the old master's fences"


def test_lease_whose_key_did_not_survive_the_failover_is_lost_on_renew(cluster, tmp_path):  # type: ignore[no-untyped-def]
    t = cluster
    # A shard whose master and replica are both still alive (the test above used one).
    shard = None
    for master, name in names_on_masters(t, "keep").items():
        _, replicas = t.shard_of(_lock_key(name))
        try:
            ok = t.node(master).execute_command("ROLE")[0] == b"master" and replicas
        except Exception:
            ok = False
        if ok and all(t.node(r).execute_command("ROLE")[0] == b"slave" for r in replicas):
            shard = (master, replicas[0], name)
            break
    assert shard, "a shard with a live master and replica"
    master_addr, replica_addr, kept_name = shard
    slots = t.slots()
    gone_name = next(f"gone{i}" for i in range(10_000) if t.shard_of(_lock_key(f"gone{i}"), slots)[0] == master_addr)
    master, replica = t.node(master_addr), t.node(replica_addr)
    opts = dict(socket_timeout=0.5, socket_connect_timeout=0.5)
    holder = LockClient(RedisClusterExecutor(url=t.url, **opts))
    newcomer = LockClient(RedisClusterExecutor(url=t.url, **opts))
    gate = _gate(tmp_path / "gate.db")
    try:
        kept = holder.acquire(kept_name, ttl=8)
        assert master.execute_command("WAIT", 1, 5000) == 1, "the replica acknowledged the kept lease"
        # The replica falls behind, deterministically: frozen, its replication link closed by
        # the master, which dies before the replica could reconnect.
        t.signal(replica_addr, signal.SIGSTOP)
        try:
            assert master.execute_command("CLIENT", "KILL", "TYPE", "replica") >= 1
            lost_calls: list[Any] = []
            gone = holder.acquire(gone_name, ttl=8, on_lost=lost_calls.append)
            assert master.exists(_lock_key(gone_name)) == 1
            killed = t.kill(master_addr)
        finally:
            t.signal(replica_addr, signal.SIGCONT)
        t.wait_promoted(replica_addr)
        promoted = time.monotonic() - killed
        assert replica.exists(_lock_key(kept_name)) == 1, "the replicated lease's key survived"
        assert replica.exists(_lock_key(gone_name)) == 0, "the unreplicated lease's key was lost"
        assert gone.lost.wait(20), "the lost lease's loss signal fired"
        detected = time.monotonic() - killed
        assert gone.lost_reason == "rejected", gone.lost_reason
        assert not gone.is_held()
        wait_until(lambda: len(lost_calls) == 1, 5, "on_lost")
        kept.renew()  # raises LockLost if its key were gone
        assert kept.is_held()
        print(f"\ncluster: promoted {promoted:.2f} s after the kill; loss detected {detected:.2f} s after it")
        newer = newcomer.acquire(gone_name, ttl=8, wait=10)
        assert newer.fencing_token > max(gone.fencing_token, kept.fencing_token)
        with gate.guard(gone_name, newer.fencing_token):
            pass
        with pytest.raises(errors.StaleFencingToken):
            with gate.guard(gone_name, gone.fencing_token):
                pass
        newer.release()
        kept.release()
    finally:
        holder.close()
        newcomer.close()


def test_cli_run_on_a_cluster(cluster, worker_env):  # type: ignore[no-untyped-def]
    """``leasehold run --backend redis+cluster://...`` (the byte path: the core routes by
    slot, no redis-py in the CLI's path): commands on names in different slots,
    fences increasing per name; bad URLs are usage errors, an unreachable cluster is 69 with
    the password redacted; ``status`` reads the name's master through the core's query."""
    from test_redis_cli import run_cli

    t = cluster
    echo = ["--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    spread = names_on_masters(t, "cli")
    fences = {}
    for master, name in spread.items():
        first = run_cli(["run", name, "--backend", t.url, *echo], worker_env)
        assert first.returncode == 0, first.stderr
        assert t.node(master).get(f"lh:{{{name}}}:fence") is not None, "granted on the slot's master"
        fences[name] = int(first.stdout)
    name = next(iter(fences))
    again = run_cli(["run", name, "--backend", t.url, *echo], worker_env)
    assert again.returncode == 0, again.stderr
    assert int(again.stdout) > fences[name]
    status = run_cli(["status", name, "--backend", t.url, "--json"], worker_env)
    assert status.returncode == 1, status  # free, and the last fence is the one just granted
    assert json.loads(status.stdout)["last_fencing_token"] == int(again.stdout)
    bad = run_cli(["run", "x", "--backend", "redis+cluster://127.0.0.1:1/3", "--", "true"], worker_env)
    assert bad.returncode == 64, bad
    gone = run_cli(["run", "x", "--backend", "redis+cluster://:pw@127.0.0.1:1", "--", "true"], worker_env)
    assert gone.returncode == 69 and "pw" not in gone.stderr and "***" in gone.stderr, gone

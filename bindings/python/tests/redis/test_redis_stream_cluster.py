"""``RedisStreamExecutor`` on a real Redis Cluster (3 masters, 3 replicas: the shared
scripts/redis-cluster-test.sh, started once for this module). The core learns the slot table
from the ``redis+cluster://`` URL, opens links to every master and routes each name to its
own; the executor only moves bytes. Names on every master are taken and released; a release
wakes a waiter of another client through the name's shard channel; a master killed while a
client waits on one of its names: the waiter is granted on the promoted replica with a
higher fence."""

from __future__ import annotations

import threading
import time

import pytest

from leasehold import LockClient
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_stream import RedisStreamExecutor

from lh_cluster import ClusterTopology


@pytest.fixture(scope="module")
def cluster(redis_bin: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    t = ClusterTopology(tmp_path_factory.mktemp("stream-cluster"))
    try:
        yield t.start()
    finally:
        t.stop()


def _lock_key(name: str) -> bytes:
    return f"lh:{{{name}}}".encode()


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


def _replica_of(t: ClusterTopology, master: str) -> str:
    """The node that replicates ``master`` (by its ``ROLE``)."""
    port = int(master.rpartition(":")[2])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for addr in t.nodes:
            role = t.node(addr).execute_command("ROLE")
            if role[0] == b"slave" and int(role[2]) == port:
                return addr
        time.sleep(0.1)
    raise AssertionError(f"no replica of {master}")


def test_names_on_every_master_and_a_sharded_wake(cluster: ClusterTopology) -> None:
    names = names_on_masters(cluster, "py-sc-")
    with LockClient(RedisStreamExecutor(cluster.url)) as a, LockClient(RedisStreamExecutor(cluster.url)) as b:
        for master, name in names.items():
            with a.acquire(name, ttl=5, wait=5) as lock:
                assert lock.fencing_token > 0
                assert cluster.node(master).exists(_lock_key(name)) == 1, (master, name)
        name = next(iter(names.values()))
        held = a.acquire(name, ttl=10)
        got: list[tuple[float, int]] = []

        def wait() -> None:
            with b.acquire(name, ttl=10, wait=8) as lock:
                got.append((time.monotonic(), lock.fencing_token))

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.5)
        assert not got
        released = time.monotonic()
        held.release()
        t.join(10)
        assert got, "the waiter was not granted"
        assert got[0][0] - released < 2.0  # woken, not the 10 s idle recheck
        assert got[0][1] > held.fencing_token
        assert b.backend_counters()["wakeups"] >= 1


def test_a_waiter_follows_a_master_kill(cluster: ClusterTopology) -> None:
    names = names_on_masters(cluster, "py-sk-")
    doomed, name = next(iter(names.items()))
    replica = _replica_of(cluster, doomed)
    with LockClient(RedisStreamExecutor(cluster.url)) as a, LockClient(RedisStreamExecutor(cluster.url)) as b:
        held = a.acquire(name, ttl=3)
        got: list[int] = []

        def wait() -> None:
            with b.acquire(name, ttl=5, wait=40) as lock:
                got.append(lock.fencing_token)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        cluster.kill(doomed)
        promoted_in = cluster.wait_promoted(replica, timeout=30)
        # The holder lets go (its lease may be lost already).
        try:
            held.release()
        except Exception:  # noqa: BLE001 - lost or unconfirmed: the waiter's grant is the point
            pass
        t.join(30)
        assert got, f"the waiter did not follow the failover (promoted in {promoted_in:.1f} s)"
        assert got[0] > held.fencing_token
        # Every other name is still served.
        for master, other in names.items():
            if master != doomed:
                with a.acquire(other, ttl=5, wait=10) as lock:
                    assert lock.fencing_token > 0


def test_from_url_takes_the_byte_path_on_a_cluster(cluster: ClusterTopology) -> None:
    """``RedisLockService.from_url("redis+cluster://…")``: a service on the byte path (streams
    opened by the core, no redis-py in the way) that locks names on every master, answers
    ``status`` and ``ping`` through the core's query, and refuses ``.client``."""
    names = names_on_masters(cluster, "py-su-")
    svc = RedisLockService.from_url(cluster.url)
    assert isinstance(svc, RedisLockService) and isinstance(svc, RedisStreamExecutor)
    assert svc.ping()
    with LockClient(svc) as c:
        for master, name in names.items():
            with c.acquire(name, ttl=5, wait=5) as lock:
                assert cluster.node(master).exists(_lock_key(name)) == 1
                st = svc.status(name)
                assert st.held and st.fencing_token == lock.fencing_token
        k = c.counters()
        assert k.stream_opens >= 4  # the topology's, and a stream per master at least
        assert k.cluster_refreshes >= 1 and k.sentinel_lookups == 0, k  # the slot map was asked for
        with pytest.raises(ValueError, match="RedisCluster"):
            svc.client

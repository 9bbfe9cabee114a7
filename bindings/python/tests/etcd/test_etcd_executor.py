"""EtcdExecutor / AsyncEtcdExecutor: the core's etcd protocol on a real 3-member cluster
through its JSON gateway (one cluster per test session; each test its own lock names)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.aio import AsyncLockClient
from leasehold.backends.etcd_executor import AsyncEtcdExecutor, EtcdExecutor, parse_endpoints


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _grants(path: Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


def _max_fence(workdir: Path) -> int:
    return max((f for p in workdir.glob("grants-*") for f in _grants(p)), default=0)


def _wait_for_grant_above(workdir: Path, mark: int, bound: float = 30.0) -> int:
    """The highest fence the loop workers recorded, once one is above ``mark`` (bounded)."""
    end = time.monotonic() + bound
    while (top := _max_fence(workdir)) <= mark and time.monotonic() < end:
        time.sleep(0.05)
    return top


def _line(p, timeout: float = 60.0) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert out and out[0], f"worker said nothing within {timeout}s"
    return out[0].strip()


def test_processes_contend_fences_increase_and_the_gate_loses_no_update(etcd_cluster, tmp_path: Path, spawn) -> None:
    name, gate = _name(), tmp_path / "gate.db"
    # Each worker starts at another member: requests and watches cross the cluster.
    eps = etcd_cluster.urls
    workers = [
        spawn("contend", "etcd:" + ",".join(eps[i:] + eps[:i]), name, "8", str(tmp_path), f"sqlite:{gate}")
        for i in range(3)
    ]
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and out.split() == ["DONE"], err
    fences = _grants(tmp_path / "grants")
    assert len(fences) == 24
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    with sqlite3.connect(gate) as conn:
        assert conn.execute("SELECT n FROM lh_counter WHERE id = 1").fetchone() == (24,)


def test_a_waiter_wakes_on_release_and_the_async_executor_contends_too(etcd_cluster) -> None:
    name = _name()
    with LockClient(EtcdExecutor(etcd_cluster.urls)) as a, LockClient(EtcdExecutor(etcd_cluster.urls[::-1])) as b:
        held = a.acquire(name, ttl=30.0)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(b.acquire(name, ttl=5.0, wait=25.0)))
        t.start()
        time.sleep(0.5)
        released_at = time.monotonic()
        held.release()
        t.join(30)
        assert got and time.monotonic() - released_at < 15.0  # woken by its watch, not the TTL
        assert got[0].fencing_token > held.fencing_token  # type: ignore[attr-defined]
        got[0].release()  # type: ignore[attr-defined]
        assert b.backend_counters()["wakeups"] >= 1
        # Keep-alives renew the etcd lease: held across several TTLs.
        with a.acquire(_name(), ttl=1.0) as lock:
            time.sleep(2.5)
            assert lock.is_held() and not lock.lost.is_set()
        assert a.counters().renewals_ok >= 3

    async def main() -> list[int]:
        fences: list[int] = []
        async with AsyncLockClient(AsyncEtcdExecutor(etcd_cluster.urls)) as x, AsyncLockClient(
            AsyncEtcdExecutor(etcd_cluster.endpoints)
        ) as y:

            async def worker(c: AsyncLockClient) -> None:
                for _ in range(4):
                    async with await c.acquire(name, ttl=5.0, wait=20.0) as lock:
                        fences.append(lock.fencing_token)
                        await asyncio.sleep(0.01)

            await asyncio.wait_for(asyncio.gather(worker(x), worker(y)), 60)
        return fences

    fences = asyncio.run(main())
    assert len(fences) == 8 and all(p < q for p, q in zip(fences, fences[1:])), fences


def _leases(url: str) -> set[str]:
    req = urllib.request.Request(url + "/v3/lease/leases", data=b"{}")
    with urllib.request.urlopen(req, timeout=5) as r:
        return {lease["ID"] for lease in json.loads(r.read()).get("leases", [])}


def test_locks_of_a_client_share_one_etcd_lease_and_close_revokes_it(etcd_cluster) -> None:
    url = etcd_cluster.urls[0]
    before = _leases(url)
    with LockClient(EtcdExecutor(etcd_cluster.urls)) as c:
        with c.acquire(_name(), ttl=10.0), c.acquire(_name(), ttl=10.0):
            for _ in range(3):
                with c.acquire(_name(), ttl=10.0):
                    pass
            assert len(_leases(url) - before) == 1
        assert c.backend_counters()["leases_granted"] == 1
    assert not _leases(url) - before

    async def main() -> None:
        async with AsyncLockClient(AsyncEtcdExecutor(etcd_cluster.urls)) as x:
            async with await x.acquire(_name(), ttl=10.0):
                assert len(_leases(url) - before) == 1

    asyncio.run(main())
    assert not _leases(url) - before


def test_a_paused_holder_is_fenced_out_and_learns_it_lost_the_lock(etcd_cluster, tmp_path: Path, spawn) -> None:
    name, gate = _name(), f"sqlite:{tmp_path / 'gate.db'}"
    holder = spawn("hold", f"etcd:{etcd_cluster.endpoints}", name, "2", gate)
    first = int(_line(holder).split()[1])
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        writer = spawn("write", f"etcd:{etcd_cluster.endpoints}", name, "5", gate)
        said = _line(writer)
        assert said.startswith("WROTE"), said
        second = int(said.split()[1])
        assert second > first
        holder.stdin.write("write\n")
        holder.stdin.flush()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    assert _line(holder) == f"WRITE-REJECTED {second}"
    assert _line(holder).startswith("LOST")
    holder.stdin.close()
    assert holder.wait(30) == 0


def test_a_killed_member_is_failed_over_and_fences_never_regress(etcd_cluster, tmp_path: Path, spawn) -> None:
    name = _name()
    # Both workers start at member 0, the one that dies.
    workers = [spawn("loop", f"etcd:{etcd_cluster.endpoints}", name, "60", str(tmp_path)) for _ in range(2)]
    before = _wait_for_grant_above(tmp_path, 0)
    assert before > 0, "no grant before the kill"
    etcd_cluster.kill(0)
    try:
        mark = _max_fence(tmp_path)
        after = _wait_for_grant_above(tmp_path, mark)  # acquisitions resume on the others
        time.sleep(0.5)
        (tmp_path / "stop").touch()
        for w in workers:
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0 and out.startswith("DONE"), err
    finally:
        etcd_cluster.restart(0)
    every: list[int] = []
    for p in tmp_path.glob("grants-*"):
        fences = _grants(p)
        assert all(a < b for a, b in zip(fences, fences[1:])), fences
        every += fences
    assert len(every) == len(set(every))
    assert after > mark >= before and max(every) >= after, "no grant after the kill"


def test_unreachable_members_and_bad_endpoints_are_clear_errors() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    client = LockClient(EtcdExecutor([f"http://127.0.0.1:{port}"], timeout=0.5))
    with pytest.raises(errors.BackendUnavailable) as e:
        client.acquire("n", ttl=5.0, wait=0.5)
    # What the host saw, not a vaguer "no reply".
    assert "Connection refused" in str(e.value), str(e.value)
    # The last request that failed: the lease grant, or the cleanup delete of the attempt
    # whose outcome is unknown, whichever came last.
    last = client.backend_last_error()
    assert "Connection refused" in last and ("/v3/lease/grant" in last or "/v3/kv/deleterange" in last), last
    client.close(timeout=0.2)
    assert parse_endpoints("etcd://a:1, b:2") == ["http://a:1", "http://b:2"]
    for bad in ("", "ftp://x:1", "http://x:1/path"):
        with pytest.raises(ValueError):
            EtcdExecutor(bad)


def _post(url: str, path: str, body: dict, token: str = "") -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    if token:
        req.add_header("Authorization", token)
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read() or b"{}")


def test_with_authentication_the_right_password_works_and_a_wrong_one_grants_nothing(etcd_cluster) -> None:
    url = etcd_cluster.urls[1]
    _post(url, "/v3/auth/user/add", {"name": "root", "password": "rootpw"})
    _post(url, "/v3/auth/role/add", {"name": "root"})
    _post(url, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    _post(url, "/v3/auth/enable", {})
    try:
        name = _name()
        wrong = LockClient(EtcdExecutor(etcd_cluster.urls, user="root", password="nope"))
        with pytest.raises(errors.BackendUnavailable) as e:
            wrong.acquire(name, ttl=5.0, wait=1.0)
        assert "authentication failed" in str(e.value) or "invalid" in str(e.value), str(e.value)
        wrong.close(timeout=0.2)
        with LockClient(EtcdExecutor(etcd_cluster.urls, user="root", password="rootpw")) as right:
            with right.acquire(name, ttl=3.0, wait=5.0) as lock:
                assert lock.fencing_token > 0
    finally:
        token = _post(url, "/v3/auth/authenticate", {"name": "root", "password": "rootpw"})["token"]
        _post(url, "/v3/auth/disable", {}, token)

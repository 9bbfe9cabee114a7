"""Servers for the history harness: started on free loopback ports through the repository's test
scripts (or redis-server directly), faulted, and stopped by pid."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "scripts")


class ServerMissing(RuntimeError):
    """A server binary is not installed (a skip locally, a failure under CI=true)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(name: str, *args: str, timeout: float = 180, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        ["bash", os.path.join(SCRIPTS, name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if res.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args[:1])} failed: {res.stderr.strip()[-2000:]}")
    return res.stdout


def redis_cmd(port: int, *args: str, timeout: float = 2) -> str:
    res = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True, timeout=timeout
    )
    return res.stdout


def wait_redis(port: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis on {port} did not answer")


def kill_wait(pid: int, sig: int = signal.SIGKILL, seconds: float = 10) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.02)


def respawn(argv: list[str], node_dir: str) -> Callable[[], None]:
    """A starter for a killed node of the test scripts (redis-server renames its process, so
    the arguments mirror the scripts'); it writes the pid where their ``stop`` looks."""

    def start() -> None:
        with open(os.path.join(node_dir, "log"), "ab") as out:
            proc = subprocess.Popen(argv, cwd=node_dir, stdout=out, stderr=out, start_new_session=True)
        with open(os.path.join(node_dir, "pid"), "w") as f:
            f.write(f"{proc.pid}\n")

    return start


COMMON = ["--bind", "127.0.0.1", "--protected-mode", "no", "--daemonize", "no", "--save", "", "--appendonly", "no"]


class Redis:
    """One redis-server; ``persistent``: AOF with an fsync per write, so a restart keeps every
    acknowledged write."""

    def __init__(self, tmp: str, persistent: bool) -> None:
        if shutil.which("redis-server") is None:
            raise ServerMissing("redis-server")
        self.dir = os.path.join(tmp, "redis-aof" if persistent else "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.endpoints = [("127.0.0.1", self.port)]

    def start(self) -> None:
        persist = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", self.dir, *persist],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_redis(self.port)

    def crash(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# The fenced store must keep what it acknowledged across a crash: PostgreSQL's defaults (every
# commit waits for its WAL flush), not the test server's synchronous_commit=off, under which an
# immediate shutdown loses the last commits (the lost-write check reports them).
DURABLE = {"PG_TEST_DURABLE": "1"}


class Postgres:
    def __init__(self, tmp: str) -> None:
        import glob

        if shutil.which("initdb") is None and not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
            raise ServerMissing("postgresql")
        self.dir = os.path.join(tmp, "pg")
        self.url = script("pg-test-server.sh", "start", self.dir, env=DURABLE).strip().splitlines()[-1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.endpoints = [("127.0.0.1", self.port)]

    def crash(self) -> None:
        """An immediate shutdown (SIGQUIT to the postmaster): no checkpoint, recovery on start."""
        with open(os.path.join(self.dir, "data", "postmaster.pid")) as f:
            pid = int(f.readline())
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)

    def start(self) -> None:
        script("pg-test-server.sh", "start", self.dir, env=DURABLE)

    def stop(self) -> None:
        script("pg-test-server.sh", "stop", self.dir)


class Etcd:
    def __init__(self, tmp: str) -> None:
        if shutil.which("etcd") is None:
            raise ServerMissing("etcd")
        self.dir = os.path.join(tmp, "etcd")
        urls = script("etcd-test-cluster.sh", "start", self.dir, "3").strip().splitlines()[-1].split(",")
        self.members = urls
        self.endpoints = [(u.split("://")[1].split(":")[0], int(u.rsplit(":", 1)[1])) for u in urls]
        self.url = "etcd://" + ",".join(f"{h}:{p}" for h, p in self.endpoints)

    def status(self, i: int) -> dict:
        req = urllib.request.Request(self.members[i] + "/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(req, timeout=1) as r:
            return json.loads(r.read())

    def leader(self) -> int:
        """The 1-based index of the member that is leader now."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for i in range(len(self.members)):
                try:
                    st = self.status(i)
                except OSError:
                    continue
                if st.get("leader") and st["leader"] == st.get("header", {}).get("member_id"):
                    return i + 1
            time.sleep(0.1)
        raise RuntimeError("etcd: no leader")

    def pid(self, i: int) -> int:
        return int(script("etcd-test-cluster.sh", "pid", self.dir, str(i)).strip())

    def kill(self, i: int) -> None:
        script("etcd-test-cluster.sh", "kill", self.dir, str(i))

    def restart(self, i: int) -> None:
        script("etcd-test-cluster.sh", "restart", self.dir, str(i))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.status(i - 1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"etcd member {i} did not come back")

    def stop(self) -> None:
        script("etcd-test-cluster.sh", "stop", self.dir)


class Sentinel:
    def __init__(self, tmp: str) -> None:
        if shutil.which("redis-server") is None:
            raise ServerMissing("redis-server")
        self.dir = os.path.join(tmp, f"sentinel-{time.monotonic_ns()}")
        out = script("redis-sentinel-test.sh", "start", self.dir)
        kv = dict(line.split(" ", 1) for line in out.strip().splitlines())
        self.name = kv["name"]
        self.url = f"redis+sentinel://{kv['sentinels']}/{self.name}"
        self.endpoints = []

    def master(self) -> str:
        return script("redis-sentinel-test.sh", "master", self.dir).strip()

    def kill_master(self) -> str:
        """SIGKILL the master the sentinels name now; returns its address. ``restart_killed``
        starts it again (the sentinels make it a replica)."""
        addr = self.master()
        for node in ("master", "replica"):
            with open(os.path.join(self.dir, node, "port")) as f:
                if addr.endswith(":" + f.read().strip()):
                    n = os.path.join(self.dir, node)
                    port = addr.rsplit(":", 1)[1]
                    pid = int(script("redis-sentinel-test.sh", "pid", self.dir, node).strip())
                    self.restart_killed = respawn(["redis-server", "--port", port, "--dir", n, *COMMON], n)
                    kill_wait(pid)
                    return addr
        raise RuntimeError(f"sentinel: no node at {addr}")

    def wait_failover(self, old: str, seconds: float = 30) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if self.master() != old:
                    return True
            except RuntimeError:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        script("redis-sentinel-test.sh", "stop", self.dir)


class Cluster:
    def __init__(self, tmp: str) -> None:
        if shutil.which("redis-server") is None:
            raise ServerMissing("redis-server")
        self.dir = os.path.join(tmp, f"cluster-{time.monotonic_ns()}")
        out = script("redis-cluster-test.sh", "start", self.dir)
        nodes = out.strip().splitlines()[-1].split(" ", 1)[1]
        self.nodes = nodes.split(",")
        self.url = f"redis+cluster://{nodes}"
        self.endpoints = []

    def master_of(self, key: str) -> tuple[str, str]:
        """(address, node id) of the master serving ``key``'s slot."""
        for addr in self.nodes:
            port = int(addr.rsplit(":", 1)[1])
            try:
                slot = int(redis_cmd(port, "CLUSTER", "KEYSLOT", key).strip())
                lines = redis_cmd(port, "CLUSTER", "NODES").strip().splitlines()
            except (ValueError, subprocess.TimeoutExpired):
                continue
            for line in lines:
                f = line.split()
                if "master" not in f[2] or "fail" in f[2]:
                    continue
                for rng in f[8:]:
                    if rng.startswith("["):
                        continue
                    lo, _, hi = rng.partition("-")
                    if int(lo) <= slot <= int(hi or lo):
                        return f[1].split("@")[0], f[0]
        raise RuntimeError(f"cluster: no master for {key!r}")

    def kill_master_of(self, key: str) -> str:
        """SIGKILL the master serving ``key``; ``restart_killed`` starts it again (it rejoins
        as a replica of the promoted one)."""
        addr, _ = self.master_of(key)
        port = addr.rsplit(":", 1)[1]
        n = os.path.join(self.dir, port)
        pid = int(script("redis-cluster-test.sh", "pid", self.dir, port).strip())
        timeout = os.environ.get("LH_CLUSTER_NODE_TIMEOUT_MS", "2000")
        self.restart_killed = respawn(
            ["redis-server", "--port", port, "--dir", n, *COMMON, "--cluster-enabled", "yes",
             "--cluster-config-file", os.path.join(n, "nodes.conf"), "--cluster-node-timeout", timeout],
            n,
        )  # fmt: skip
        kill_wait(pid)
        return addr

    def wait_failover(self, key: str, old: str, seconds: float = 30) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                addr, _ = self.master_of(key)
                if addr != old:
                    return True
            except RuntimeError:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        script("redis-cluster-test.sh", "stop", self.dir)

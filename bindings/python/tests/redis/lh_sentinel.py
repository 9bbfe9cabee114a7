"""A real Redis Sentinel topology for the tests (1 master, 1 replica, 3 sentinels), started
and stopped by ``scripts/redis-sentinel-test.sh`` (free loopback ports, processes stopped by
pid), which the Go and C++ suites use too."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "redis-sentinel-test.sh"


class SentinelTopology:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.addresses: dict[str, str] = {}
        self.started = False

    def start(self) -> SentinelTopology:
        out = subprocess.run(
            ["bash", str(SCRIPT), "start", str(self.dir)], capture_output=True, text=True, timeout=120
        )
        self.started = True
        if out.returncode != 0:
            raise RuntimeError(f"redis-sentinel-test.sh start failed:\n{out.stdout}\n{out.stderr}")
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            self.addresses[key] = value
        return self

    def stop(self) -> None:
        if self.started:
            subprocess.run(["bash", str(SCRIPT), "stop", str(self.dir)], timeout=60, check=False)
            self.started = False

    @property
    def name(self) -> str:
        return self.addresses["name"]

    @property
    def sentinels(self) -> str:
        return self.addresses["sentinels"]

    @property
    def url(self) -> str:
        return f"redis+sentinel://{self.sentinels}/{self.name}"

    def pid(self, node: str) -> int:
        return int((self.dir / node / "pid").read_text())

    def signal(self, node: str, sig: int) -> None:
        os.kill(self.pid(node), sig)

    def kill(self, node: str) -> float:
        """SIGKILL a node; the monotonic time of the kill. Waits until it is dead (a zombie
        counts: the script's shell is gone, so whoever adopted it reaps it)."""
        pid = self.pid(node)
        os.kill(pid, signal.SIGKILL)
        at = time.monotonic()
        end = at + 10
        while time.monotonic() < end:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                return at
            if state in ("Z", "X"):
                return at
            time.sleep(0.01)
        raise AssertionError(f"{node} (pid {pid}) did not die")

    def node(self, role: str) -> redis.Redis:
        """A plain client on the node that started as ``role`` (master or replica)."""
        host, _, port = self.addresses[role].rpartition(":")
        return redis.Redis(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=2)

    def reported_master(self) -> str | None:
        """The master's address as the first sentinel that answers reports it."""
        for addr in self.sentinels.split(","):
            host, _, port = addr.rpartition(":")
            try:
                with redis.Redis(host=host, port=int(port), socket_timeout=1, socket_connect_timeout=1) as s:
                    reply = s.execute_command("SENTINEL", "get-master-addr-by-name", self.name)
            except redis.RedisError:
                continue
            if reply:
                return f"{reply[0].decode()}:{reply[1].decode()}"
        return None

    def wait_promoted(self, timeout: float = 60.0) -> float:
        """Wait until the sentinels name the replica as master and it says so itself; the
        seconds waited."""
        start = time.monotonic()
        replica = self.node("replica")
        while True:
            if self.reported_master() == self.addresses["replica"]:
                try:
                    if replica.execute_command("ROLE")[0] == b"master":
                        return time.monotonic() - start
                except redis.RedisError:
                    pass
            if time.monotonic() - start > timeout:
                raise AssertionError(f"no promotion within {timeout} s (sentinels say {self.reported_master()})")
            time.sleep(0.05)

"""A real Redis Cluster for the tests (3 masters, 3 replicas), started and stopped by
``scripts/redis-cluster-test.sh`` (free loopback ports, processes stopped by pid), which the
Go suite uses too."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "redis-cluster-test.sh"


def key_slot(key: bytes) -> int:
    from redis.crc import key_slot as slot

    return int(slot(key))


class ClusterTopology:
    """``tls``: a directory with ``ca.crt``, ``server.crt`` and ``server.key``; every node then
    serves TLS only (see the script)."""

    def __init__(self, workdir: Path, tls: Path | None = None) -> None:
        self.dir = workdir
        self.tls = tls
        self.nodes: list[str] = []
        self.started = False

    def start(self) -> ClusterTopology:
        env = dict(os.environ)
        if self.tls is not None:
            env["LH_CLUSTER_TLS"] = str(self.tls)
        out = subprocess.run(["bash", str(SCRIPT), "start", str(self.dir)], capture_output=True, text=True, timeout=180, env=env)
        self.started = True
        if out.returncode != 0:
            raise RuntimeError(f"redis-cluster-test.sh start failed:\n{out.stdout}\n{out.stderr}")
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "nodes":
                self.nodes = value.split(",")
        assert len(self.nodes) == 6, out.stdout
        return self

    def stop(self) -> None:
        if self.started:
            subprocess.run(["bash", str(SCRIPT), "stop", str(self.dir)], timeout=60, check=False)
            self.started = False

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(self.nodes)

    def node(self, addr: str) -> redis.Redis:
        host, _, port = addr.rpartition(":")
        tls = {} if self.tls is None else {"ssl": True, "ssl_ca_certs": str(self.tls / "ca.crt")}
        return redis.Redis(host=host, port=int(port), socket_timeout=2, socket_connect_timeout=1, retry=None, **tls)

    def slots(self) -> list[tuple[int, int, str, list[str]]]:
        """(first slot, last slot, master, replicas) per range, from the first live node
        that answers with every slot covered (a dead node is skipped)."""
        for addr in self.nodes:
            try:
                reply = self.node(addr).execute_command("CLUSTER SLOTS")
            except redis.RedisError:
                continue
            out = []
            for start, end, *owners in reply:
                addrs = [f"{o[0].decode()}:{o[1]}" for o in owners]
                out.append((int(start), int(end), addrs[0], addrs[1:]))
            if sum(e - s + 1 for s, e, _, _ in out) == 16384:
                return out
        raise AssertionError("no node answered CLUSTER SLOTS with every slot covered")

    def shard_of(self, key: bytes, slots: list[tuple[int, int, str, list[str]]] | None = None) -> tuple[str, list[str]]:
        """(master, replicas) serving ``key``'s slot, as a live node reports them."""
        slot = key_slot(key)
        for start, end, master, replicas in slots or self.slots():
            if start <= slot <= end:
                return master, replicas
        raise AssertionError(f"slot {slot} is not served")

    def pid(self, addr: str) -> int:
        return int((self.dir / addr.rpartition(":")[2] / "pid").read_text())

    def signal(self, addr: str, sig: int) -> None:
        os.kill(self.pid(addr), sig)

    def kill(self, addr: str) -> float:
        """SIGKILL a node; the monotonic time of the kill, once it is dead."""
        pid = self.pid(addr)
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
        raise AssertionError(f"{addr} (pid {pid}) did not die")

    @staticmethod
    def cluster_ok(r: redis.Redis) -> bool:
        info = r.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
        state = info.get("cluster_state") if isinstance(info, dict) else None
        return state in ("ok", b"ok") or (isinstance(info, bytes) and b"cluster_state:ok" in info)

    def wait_promoted(self, replica: str, timeout: float = 60.0) -> float:
        """Wait until ``replica`` is a master and reports the cluster ok; the seconds waited."""
        start = time.monotonic()
        r = self.node(replica)
        while True:
            try:
                if r.execute_command("ROLE")[0] == b"master" and self.cluster_ok(r):
                    return time.monotonic() - start
            except redis.RedisError:
                pass
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{replica} was not promoted within {timeout} s")
            time.sleep(0.05)

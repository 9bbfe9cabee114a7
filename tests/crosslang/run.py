"""Cross-language contention: Python, Go, C++ (and C) processes take turns on one lock name.

    run.py --go GO_WORKER --cpp CPP_WORKER [--c C_WORKER] [--rounds N] [--backend BACKEND]

BACKEND is redis, postgres or etcd (each binding's executor of the core's protocol), or
redis-bytes, redis-sentinel or redis-cluster (the byte executors: the core owns the Redis wire;
the C worker joins, given --c). Starts the backend itself (redis-server, a Sentinel set of a
master, a replica and 3 sentinels, a Redis Cluster of 3 masters and 3 replicas, a PostgreSQL
cluster or a 3-member etcd cluster on free loopback ports, stopped by pid), runs one worker per language, and checks the shared log they append to:
no two holders overlap, fences strictly increase, at least 200 handoffs, every direction
between the languages. See README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from itertools import permutations

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIN_HANDOFFS = 200
#: Backends whose workers take the byte executors.
BYTE_BACKENDS = ("redis-bytes", "redis-sentinel", "redis-cluster")


class LogError(AssertionError):
    pass


def check(lines: list[str], tags: list[str]) -> tuple[int, Counter[tuple[str, str]], list[int]]:
    """The log's verdict: (handoffs, handoffs per direction, fences); raises LogError."""
    holder: tuple[str, str, str] | None = None
    fences: list[int] = []
    last_pid: str | None = None
    last_tag: str | None = None
    handoffs = 0
    directions: Counter[tuple[str, str]] = Counter()
    done = set()
    for n, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        kind = f[0]
        if kind == "enter" and len(f) == 4:
            if holder is not None:
                raise LogError(f"line {n}: {f[1]} pid {f[2]} entered while {holder} held the lock")
            fence = int(f[3])
            if fences and fence <= fences[-1]:
                raise LogError(f"line {n}: fence {fence} after {fences[-1]}")
            fences.append(fence)
            holder = (f[1], f[2], f[3])
            if last_pid is not None and f[2] != last_pid:
                handoffs += 1
                if f[1] != last_tag:
                    directions[(last_tag or "", f[1])] += 1
            last_pid, last_tag = f[2], f[1]
        elif kind == "exit" and len(f) == 4:
            if holder != (f[1], f[2], f[3]):
                raise LogError(f"line {n}: exit of {tuple(f[1:])} while {holder} held the lock")
            holder = None
        elif kind == "done" and len(f) == 3:
            done.add(f[1])
        elif kind == "ready" and len(f) == 3:
            pass
        else:
            raise LogError(f"line {n}: garbage {line!r}")
    if holder is not None:
        raise LogError(f"the log ends with {holder} holding the lock")
    if done != set(tags):
        raise LogError(f"workers done: {sorted(done)}, expected {sorted(tags)}")
    return handoffs, directions, fences


def self_test() -> None:
    """The checker refuses what it must refuse."""
    good = ["enter py 1 5", "exit py 1 5", "enter go 2 9", "exit go 2 9", "done py 1", "done go 2"]
    assert check(good, ["py", "go"])[0] == 1
    bad = {
        "overlap": ["enter py 1 5", "enter go 2 9", "exit go 2 9", "exit py 1 5"],
        "fence": ["enter py 1 5", "exit py 1 5", "enter go 2 5", "exit go 2 5"],
        "exit": ["enter py 1 5", "exit go 2 5"],
        "open": ["enter py 1 5"],
        "garbage": ["enter py"],
    }
    for what, lines in bad.items():
        try:
            check(lines + ["done py 1", "done go 2"], ["py", "go"])
        except LogError:
            continue
        raise AssertionError(f"the checker accepted a log with a bad {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("run.py: redis-server not found (scripts/ensure-redis.sh installs it)")
    port = free_port()
    p = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return p, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("run.py: redis-server did not start")


class Scripted:
    """A server started and stopped by one of the repository's test scripts."""

    def __init__(self, script: str, tmp: str, *args: str) -> None:
        self.script, self.dir = os.path.join(ROOT, "scripts", script), os.path.join(tmp, "server")
        res = subprocess.run(
            ["bash", self.script, "start", self.dir, *args], capture_output=True, text=True, timeout=180
        )
        if res.returncode != 0:
            raise SystemExit(f"run.py: {script} start failed: {res.stderr.strip()}")
        self.url = res.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        subprocess.run(["bash", self.script, "stop", self.dir], check=False, timeout=120)


def start_backend(backend: str, tmp: str) -> tuple[object, str]:
    """The server for ``backend`` and the URL workers are given."""
    if backend == "redis":
        proc, url = start_redis(tmp)

        class Redis:
            def stop(self) -> None:
                proc.terminate()
                proc.wait(timeout=30)

        return Redis(), url
    if backend == "redis-bytes":
        return start_backend("redis", tmp)
    if backend == "redis-sentinel":
        sentinel = Scripted("redis-sentinel-test.sh", tmp)
        with open(os.path.join(sentinel.dir, "addresses"), encoding="ascii") as f:
            addrs = dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)
        return sentinel, f"redis+sentinel://{addrs['sentinels']}/{addrs['name']}"
    if backend == "redis-cluster":
        cluster = Scripted("redis-cluster-test.sh", tmp)
        return cluster, "redis+cluster://" + cluster.url.removeprefix("nodes ")
    if backend == "postgres":
        pg = Scripted("pg-test-server.sh", tmp)
        return pg, pg.url
    if backend == "etcd":
        etcd = Scripted("etcd-test-cluster.sh", tmp, "3")
        hosts = ",".join(u.split("://", 1)[1] for u in etcd.url.split(","))
        return etcd, f"etcd://{hosts}"
    raise SystemExit(f"run.py: unknown backend {backend!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--go", required=True)
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--c", help="the C worker (byte backends only)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--backend", default="redis", choices=["redis", "postgres", "etcd", *BYTE_BACKENDS])
    args = ap.parse_args()
    self_test()
    with tempfile.TemporaryDirectory(prefix="lh-crosslang-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs as its own user and must reach its directory
        server, url = start_backend(args.backend, tmp)
        try:
            log = os.path.join(tmp, "log")
            open(log, "w").close()
            cmds = {
                "py": [sys.executable, os.path.join(HERE, "worker.py")],
                "go": [args.go],
                "cpp": [args.cpp],
            }
            path = []
            if args.backend in BYTE_BACKENDS:
                path = ["bytes"]
                if args.c:
                    cmds["c"] = [args.c]
            tags = list(cmds)
            started = time.monotonic()
            procs = {
                t: subprocess.Popen(cmds[t] + [url, "crosslang", str(args.rounds), log, t, str(len(tags)), *path])
                for t in tags
            }
            failed = []
            for t, p in procs.items():
                try:
                    rc = p.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rc = "timeout"
                if rc != 0:
                    failed.append(f"{t}: {rc}")
            elapsed = time.monotonic() - started
            with open(log, encoding="ascii") as f:
                lines = f.read().splitlines()
        finally:
            server.stop()  # type: ignore[attr-defined]
    if failed:
        print(f"run.py: workers failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    handoffs, directions, fences = check(lines, tags)
    print(
        f"run.py: {len(fences)} grants, {handoffs} handoffs in {elapsed:.1f}s on {args.backend}; "
        + ", ".join(f"{a}->{b} {directions[(a, b)]}" for a, b in permutations(tags, 2))
    )
    if handoffs < MIN_HANDOFFS:
        print(f"run.py: only {handoffs} handoffs (want {MIN_HANDOFFS})", file=sys.stderr)
        return 1
    missing = [f"{a}->{b}" for a, b in permutations(tags, 2) if directions[(a, b)] == 0]
    if missing:
        print(f"run.py: no handoff {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

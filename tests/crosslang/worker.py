"""Cross-language contention worker (Python): see tests/crosslang/README.md.

    worker.py BACKEND NAME ROUNDS LOG TAG WORKERS [bytes]

With ``bytes`` a Redis URL (``redis://``, ``redis+sentinel://``, ``redis+cluster://``) goes to
the byte executor (the core owns the wire); without it, to redis-py.
"""

from __future__ import annotations

import os
import random
import sys
import time

from leasehold import LockClient


def executor(backend: str, path: str) -> object:
    if path == "bytes":
        from leasehold.backends.redis_stream import RedisStreamExecutor

        return RedisStreamExecutor(backend)
    if backend.startswith("redis://"):
        from leasehold.backends.redis_executor import RedisExecutor

        return RedisExecutor(url=backend)
    if backend.startswith("postgresql://"):
        from leasehold.backends.sql_executor import PostgresExecutor

        return PostgresExecutor(backend)
    if backend.startswith("etcd://"):
        from leasehold.backends.etcd_executor import EtcdExecutor

        return EtcdExecutor([f"http://{h}" for h in backend[len("etcd://") :].split(",")])
    raise SystemExit(f"worker.py: unsupported backend {backend!r}")


def append(fd: int, line: str) -> None:
    os.write(fd, line.encode())  # one write per line: O_APPEND keeps lines whole


def count(log: str, kind: str) -> int:
    with open(log, encoding="ascii") as f:
        return sum(1 for l in f if l.startswith(kind + " "))


def others_had_it(log: str, tag: str, workers: int, turns: int) -> bool:
    """Others held the lock ``turns`` times since our last exit, or every other worker is done."""
    with open(log, encoding="ascii") as f:
        lines = f.read().splitlines()
    done = sum(1 for l in lines if l.startswith("done "))
    mine = max((i for i, l in enumerate(lines) if l.startswith(f"exit {tag} ")), default=-1)
    others = sum(1 for l in lines[mine + 1 :] if l.startswith("enter ") and l.split()[1] != tag)
    return done >= workers - 1 or others >= turns


def main() -> int:
    backend, name, rounds, log, tag, workers = sys.argv[1:7]
    path = sys.argv[7] if len(sys.argv) > 7 else ""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    pid = os.getpid()
    with LockClient(executor(backend, path)) as client:
        append(fd, f"ready {tag} {pid}\n")
        deadline = time.monotonic() + 60
        while count(log, "ready") < int(workers) and time.monotonic() < deadline:
            time.sleep(0.005)
        for _ in range(int(rounds)):
            lease = client.acquire(name, 10.0, wait=60.0)
            fence = lease.fencing_token
            append(fd, f"enter {tag} {pid} {fence}\n")
            time.sleep(0.0005)
            append(fd, f"exit {tag} {pid} {fence}\n")
            outcome = lease.release()
            if outcome != "released":
                print(f"worker.py: release said {outcome!r}", file=sys.stderr)
                return 1
            # Now and then let two others go first, so a FIFO queue changes its order.
            turns = 2 if random.random() < 0.3 else 1
            deadline = time.monotonic() + 0.5
            while not others_had_it(log, tag, int(workers), turns) and time.monotonic() < deadline:
                time.sleep(0.001)
    append(fd, f"done {tag} {pid}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Python side of the Go/Python interop test (bindings/go/interop_test.go).

Contends for the same lock names on the same Redis as Go workers, through the
Python package (LockClient + RedisLockService, the Redis executor: both sides
run the core's Redis protocol), and performs the same fenced read-modify-write on the
shared SQLite file as the Go workers (same high-water-mark table and SQL as
the Go Gate, so one gate guards writers of both languages).

Environment: LH_REDIS (host:port), LH_DB (SQLite path), LH_NAMES (comma
separated), LH_ITERS, LH_ID, LH_MODE ("contend", the default, or "paused").
With LH_BACKEND=sqlite the lock service is SQLiteLockService on the file
LH_LOCKDB instead of Redis: the core's SQL protocol, as Go's SQLiteTransport
runs it on the same tables (waiters poll: SQLite has no release wake-ups).
contend prints "DONE <n>" on success. paused acquires the first name, prints
"ACQUIRED <token>", waits for a line on stdin (the parent stops and resumes
the process meanwhile), then tries its now stale write through the gate and
prints "STALE" or "WROTE", then "LOST <bool>".
"""

import os
import random
import sqlite3
import sys
import time

from leasehold import LockClient
from leasehold.backends.redis import RedisLockService
from leasehold.backends.sqlite import SQLiteLockService


class Stale(Exception):
    pass


UPSERT = (
    "INSERT INTO leasehold_fence (resource, hwm) VALUES (?, ?) "
    "ON CONFLICT (resource) DO UPDATE SET hwm = CASE WHEN excluded.hwm > leasehold_fence.hwm "
    "THEN excluded.hwm ELSE leasehold_fence.hwm END"
)


def gate(conn, name, token, fn):
    """One transaction: raise the mark, refuse token < mark, run fn."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(UPSERT, (name, token))
        (hwm,) = conn.execute("SELECT hwm FROM leasehold_fence WHERE resource = ?", (name,)).fetchone()
        if hwm > token:
            raise Stale(f"token {token} below high-water mark {hwm} for {name}")
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def critical_section(conn, name, token, worker):
    (v,) = gate(conn, name, token, lambda c: c.execute("SELECT v FROM counter WHERE name = ?", (name,)).fetchone())
    time.sleep(0.001)

    def write(c):
        c.execute("UPDATE counter SET v = ? WHERE name = ?", (v + 1, name))
        c.execute("INSERT INTO log (name, token, worker) VALUES (?, ?, ?)", (name, token, worker))

    gate(conn, name, token, write)


def paused(client, conn, name, worker):
    lock = client.acquire(name, ttl=0.4, wait=60)
    token = lock.fencing_token
    print("ACQUIRED", token, flush=True)
    sys.stdin.readline()
    try:
        gate(
            conn,
            name,
            token,
            lambda c: c.execute("INSERT INTO log (name, token, worker) VALUES (?, ?, ?)", (name, token, worker)),
        )
        print("WROTE", flush=True)
    except Stale:
        print("STALE", flush=True)
    print("LOST", lock.lost.wait(20), flush=True)
    lock.release()


def main():
    names = os.environ["LH_NAMES"].split(",")
    iters = int(os.environ["LH_ITERS"])
    worker = os.environ["LH_ID"]
    conn = sqlite3.connect(os.environ["LH_DB"], timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    if os.environ.get("LH_BACKEND") == "sqlite":
        service = SQLiteLockService(os.environ["LH_LOCKDB"])
    else:
        service = RedisLockService.from_url("redis://" + os.environ["LH_REDIS"])
    with LockClient(service) as client:
        if os.environ.get("LH_MODE") == "paused":
            paused(client, conn, names[0], worker)
            conn.close()
            return 0
        for i in range(iters):
            name = random.choice(names)
            with client.acquire(name, ttl=10, wait=120) as lock:
                critical_section(conn, name, lock.fencing_token, worker)
    conn.close()
    print("DONE", iters, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

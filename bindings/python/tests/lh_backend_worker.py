"""Worker process for the multi-process SQL and etcd executor tests (one mode per process).

A backend is ``sqlite:PATH``, ``pg:URL`` or ``etcd:URL,URL,...``; a gate is ``sqlite:PATH``
or ``pg:URL`` (the FencingGate on that database, with a ``lh_counter`` table). Every mode
prints one line per event, flushed.

``contend BACKEND NAME ITERATIONS WORKDIR GATE``
    ITERATIONS times: acquire NAME (wait up to 60 s), append the fence to WORKDIR/grants,
    then through the gate read the counter, sleep a little and write counter+1 (a racy
    read-modify-write only the lock and the gate protect); release. Prints ``DONE``.

``hold BACKEND NAME TTL GATE``
    Kleppmann's paused holder: acquire, print ``ACQUIRED <fence>``, block on stdin; on
    ``write`` write through the gate (``WRITE-OK`` / ``WRITE-REJECTED <mark>``), then wait for
    the loss signal (``LOST <reason>`` / ``STILL-HELD``).

``write BACKEND NAME TTL GATE``
    The next holder: acquire (wait up to 60 s), write through the gate, ``WROTE <fence>``.

``loop BACKEND NAME SECONDS WORKDIR``
    Acquire and release NAME until WORKDIR/stop exists (at most SECONDS), appending each
    fence to WORKDIR/grants-<pid> in grant order. Prints ``DONE grants=<n> failures=<m>``.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from leasehold import LockClient, errors
from leasehold.fencing import FencingGate

logging.basicConfig(level=logging.ERROR, stream=sys.stderr)


def say(*parts: object) -> None:
    print(*parts, flush=True)


def client_for(spec: str) -> LockClient:
    kind, _, arg = spec.partition(":")
    if kind == "sqlite":
        from leasehold.backends.sql_executor import SqliteExecutor

        return LockClient(SqliteExecutor(arg))
    if kind == "pg":
        from leasehold.backends.sql_executor import PostgresExecutor

        return LockClient(PostgresExecutor(arg, connect_timeout=2))
    if kind == "etcd":
        from leasehold.backends.etcd_executor import EtcdExecutor

        return LockClient(EtcdExecutor(arg, timeout=1.0))
    raise SystemExit(f"unknown backend {spec!r}")


def gate_for(spec: str) -> FencingGate:
    kind, _, arg = spec.partition(":")
    conn: Any
    if kind == "sqlite":
        conn = sqlite3.connect(arg, timeout=30)
        gate = FencingGate(conn)
    elif kind == "pg":
        import psycopg

        conn = psycopg.connect(arg)
        gate = FencingGate(conn, dialect="postgres")
        # Concurrent CREATE TABLE IF NOT EXISTS can collide on PostgreSQL: one at a time.
        conn.execute("SELECT pg_advisory_lock(4242)")
        conn.commit()
    else:
        raise SystemExit(f"unknown gate {spec!r}")
    gate.ensure_schema()
    cur = conn.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS lh_counter (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)")
    cur.execute("CREATE TABLE IF NOT EXISTS lh_writes (token BIGINT NOT NULL, pid INTEGER NOT NULL)")
    conn.commit()
    if kind == "pg":
        conn.execute("SELECT pg_advisory_unlock(4242)")
        conn.commit()
    return gate


def _q(gate: FencingGate, sql: str) -> str:
    return sql.replace("?", "%s") if gate.dialect == "postgres" else sql


def contend(spec: str, name: str, iterations: int, workdir: str, gate_spec: str) -> None:
    gate = gate_for(gate_spec)
    grants = Path(workdir) / "grants"
    rnd = random.Random(os.getpid())
    with client_for(spec) as client:
        for _ in range(iterations):
            with client.acquire(name, ttl=10.0, wait=60.0) as lock:
                with grants.open("a") as f:
                    f.write(f"{lock.fencing_token} {os.getpid()}\n")
                with gate.guard(name, lock.fencing_token) as cur:
                    cur.execute(_q(gate, "SELECT n FROM lh_counter WHERE id = 1"))
                    row = cur.fetchone()
                    value = 0 if row is None else int(row[0])
                    time.sleep(rnd.random() * 0.002)
                    if row is None:
                        cur.execute(_q(gate, "INSERT INTO lh_counter (id, n) VALUES (1, ?)"), (value + 1,))
                    else:
                        cur.execute(_q(gate, "UPDATE lh_counter SET n = ? WHERE id = 1"), (value + 1,))
    say("DONE")


def hold(spec: str, name: str, ttl: float, gate_spec: str) -> None:
    gate = gate_for(gate_spec)
    with client_for(spec) as client:
        lock = client.acquire(name, ttl=ttl, wait=30.0)
        say("ACQUIRED", lock.fencing_token)
        line = sys.stdin.readline().strip()  # the parent SIGSTOPs us while we wait here
        if line == "write":
            try:
                with gate.guard(name, lock.fencing_token) as cur:
                    cur.execute(_q(gate, "INSERT INTO lh_writes VALUES (?, ?)"), (lock.fencing_token, os.getpid()))
                say("WRITE-OK")
            except errors.StaleFencingToken:
                say("WRITE-REJECTED", gate.high_water_mark(name))
        if lock.lost.wait(30.0):
            say("LOST", lock.lost_reason, "held" if lock.is_held() else "not-held")
        else:
            say("STILL-HELD")
        lock.release()


def write(spec: str, name: str, ttl: float, gate_spec: str) -> None:
    gate = gate_for(gate_spec)
    with client_for(spec) as client:
        with client.acquire(name, ttl=ttl, wait=60.0) as lock:
            with gate.guard(name, lock.fencing_token) as cur:
                cur.execute(_q(gate, "INSERT INTO lh_writes VALUES (?, ?)"), (lock.fencing_token, os.getpid()))
            say("WROTE", lock.fencing_token)


def loop(spec: str, name: str, seconds: float, workdir: str) -> None:
    out = Path(workdir) / f"grants-{os.getpid()}"
    stop = Path(workdir) / "stop"
    grants = failures = 0
    end = time.monotonic() + seconds
    with client_for(spec) as client:
        while time.monotonic() < end and not stop.exists():
            try:
                lock = client.acquire(name, ttl=2.0, wait=1.0)
            except (errors.LockTimeout, errors.AcquireCancelled):
                failures += 1
                continue
            grants += 1
            with out.open("a") as f:
                f.write(f"{lock.fencing_token}\n")
            time.sleep(0.005)
            lock.release()
    say(f"DONE grants={grants} failures={failures}")


def main(argv: list[str]) -> None:
    mode = argv[1]
    if mode == "contend":
        contend(argv[2], argv[3], int(argv[4]), argv[5], argv[6])
    elif mode == "hold":
        hold(argv[2], argv[3], float(argv[4]), argv[5])
    elif mode == "write":
        write(argv[2], argv[3], float(argv[4]), argv[5])
    elif mode == "loop":
        loop(argv[2], argv[3], float(argv[4]), argv[5])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)

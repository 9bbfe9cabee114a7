"""leasehold's ``PostgresExecutor`` against PostgreSQL's advisory locks, in one run on one
server: uncontended acquire + release, as a ratio.

Run (from bindings/python, after `cargo build --release` and ./setup-venv.sh)::

    .venv/bin/python bench/bench_postgres.py            # starts a durable throw-away cluster
    .venv/bin/python bench/bench_postgres.py --url postgresql://…

Without ``--url`` the script starts a cluster with ``PG_TEST_DURABLE=1
scripts/pg-test-server.sh`` (PostgreSQL's default durability: every commit waits for its WAL
flush, as in production) and stops it at the end. The variants, each on its own connection:

- advisory: ``pg_try_advisory_lock(42)`` + ``pg_advisory_unlock(42)`` (no TTL, no fence,
  nothing written);
- leasehold / leasehold-async: ``LockClient(PostgresExecutor(url[, asynchronous_commit=True]))``;
- statements / statements-async: the protocol's two statements straight on psycopg (the
  server's share, without the core and the executor);
- updates / updates-async: two one-row UPDATEs (the least any lock kept in a table writes).

Each round runs every variant for ``--seconds`` in a rotated order; each variant's median
round is printed with its ratio to advisory, so the machine's load weighs on all alike, and
with this process's CPU time per cycle (the host's share). Last, leasehold's ratio to its
driver floor (the same statements on bare psycopg), the median over rounds of the two in one
round.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import psycopg

from leasehold import LockClient
from leasehold.backends.sql_executor import PostgresExecutor

REPO = Path(__file__).resolve().parents[3]
TOKEN = "00112233445566778899aabbccddeeff"
ACQUIRE = "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire(%s, %s, %s)"
RELEASE = "SELECT leasehold_release(%s, %s, %s)"
OFF = "set_config('synchronous_commit', 'off', true) s"
ACQUIRE_ASYNC = f"SELECT a.lh_granted, a.lh_fence, a.lh_remaining_ms FROM {OFF}, leasehold_acquire(%s, %s, %s) a"
RELEASE_ASYNC = f"SELECT leasehold_release(%s, %s, %s) FROM {OFF}"


def variants(url: str, closers: list[Callable[[], None]]) -> list[tuple[str, Callable[[], None]]]:
    def conn(asynchronous: bool = False) -> psycopg.Connection:
        c = psycopg.connect(url, autocommit=True, prepare_threshold=0)
        if asynchronous:
            c.execute("SET synchronous_commit = off")
        closers.append(c.close)
        return c

    def leasehold(asynchronous: bool) -> Callable[[], None]:
        client = LockClient(PostgresExecutor(url, asynchronous_commit=asynchronous))
        closers.append(client.close)
        name = f"bench-{uuid.uuid4().hex[:8]}"

        def op() -> None:
            client.acquire(name, ttl=10.0, wait=60.0).release()

        return op

    def statements(asynchronous: bool) -> Callable[[], None]:
        c, name = conn(), f"bench-s-{uuid.uuid4().hex[:8]}"
        acquire, release = (ACQUIRE_ASYNC, RELEASE_ASYNC) if asynchronous else (ACQUIRE, RELEASE)

        def op() -> None:
            row = c.execute(acquire, (name, TOKEN, 10000)).fetchone()
            assert row is not None and row[0], row
            (released,) = c.execute(release, (name, TOKEN, "lh_bench")).fetchone() or (None,)
            assert released, released

        return op

    def updates(asynchronous: bool) -> Callable[[], None]:
        c = conn(asynchronous)

        def op() -> None:
            c.execute("UPDATE lh_bench_row SET n = n + 1 WHERE k = 1")
            c.execute("UPDATE lh_bench_row SET n = n + 1 WHERE k = 1")

        return op

    def advisory() -> Callable[[], None]:
        c = conn()

        def op() -> None:
            (ok,) = c.execute("SELECT pg_try_advisory_lock(42)").fetchone() or (None,)
            assert ok
            (ok,) = c.execute("SELECT pg_advisory_unlock(42)").fetchone() or (None,)
            assert ok

        return op

    first = leasehold(False)
    first()  # the migration creates the functions the statements call
    setup = conn()
    setup.execute("CREATE TABLE IF NOT EXISTS lh_bench_row (k int PRIMARY KEY, n bigint NOT NULL)")
    setup.execute("INSERT INTO lh_bench_row VALUES (1, 0) ON CONFLICT DO NOTHING")
    return [
        ("advisory", advisory()),
        ("leasehold", first),
        ("leasehold-async", leasehold(True)),
        ("statements", statements(False)),
        ("statements-async", statements(True)),
        ("updates", updates(False)),
        ("updates-async", updates(True)),
    ]


def cpu() -> float:
    """This process's CPU time (the host's share: ctypes, the core, psycopg), which the
    machine's load does not inflate as it does the wall clock."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(url: str, rounds: int, seconds: float) -> None:
    closers: list[Callable[[], None]] = []
    try:
        vs = variants(url, closers)
        rates: list[list[float]] = [[] for _ in vs]
        cpus: list[list[float]] = [[] for _ in vs]
        for r in range(rounds):
            for k in range(len(vs)):
                i = (k + r) % len(vs)
                op = vs[i][1]
                n, t0, c0 = 0, time.perf_counter(), cpu()
                while time.perf_counter() - t0 < seconds:
                    op()
                    n += 1
                rates[i].append(n / (time.perf_counter() - t0))
                cpus[i].append((cpu() - c0) / n * 1e6)
        base = statistics.median(rates[0])
        print(f"load average {os.getloadavg()[0]:.2f}; {rounds} rounds of {seconds} s per variant")
        for (name, _), rs, cs in zip(vs, rates, cpus):
            m = statistics.median(rs)
            print(
                f"{name:18} {m:9.0f} ops/s  {m / base:6.3f}x advisory  ({min(rs):.0f}-{max(rs):.0f})"
                f"  {statistics.median(cs):6.0f} µs CPU/op here"
            )
        names = [name for name, _ in vs]
        for lh, floor in (("leasehold", "statements"), ("leasehold-async", "statements-async")):
            a, b = rates[names.index(lh)], rates[names.index(floor)]
            paired = [x / y for x, y in zip(a, b)]
            print(
                f"{lh} ÷ {floor} (its driver floor), paired by round: {statistics.median(paired):.3f}x"
                f" ({min(paired):.3f}-{max(paired):.3f})"
            )
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an existing server (default: start a durable throw-away cluster)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one variant's round")
    a = ap.parse_args()
    if a.url:
        run(a.url, a.rounds, a.seconds)
        return
    script = str(REPO / "scripts" / "pg-test-server.sh")
    with tempfile.TemporaryDirectory(prefix="lh-bench-pg-") as d:
        env = dict(os.environ, PG_TEST_DURABLE="1")
        url = subprocess.run(["bash", script, "start", d], env=env, check=True, capture_output=True, text=True).stdout.strip()
        try:
            run(url, a.rounds, a.seconds)
        finally:
            subprocess.run(["bash", script, "stop", d], check=False)


if __name__ == "__main__":
    main()

"""Worker process for the multi-process Redis tests (run as a script, one mode per process).

Modes (all print one line per event, flushed, so the parent can follow):

``contend URL NAME ITERATIONS WORKDIR``
    ITERATIONS times: acquire NAME (wait up to 60 s), read WORKDIR/counter, sleep a little,
    write counter+1 (a deliberately racy read-modify-write that only the lock protects), append
    the fencing token to WORKDIR/grants, release. Prints ``DONE``.

``hold URL NAME TTL DB``
    Kleppmann's paused holder: acquire NAME with TTL seconds, print ``ACQUIRED <fence>``, then
    block on stdin. On a line ``write`` it tries to write through a FencingGate on the SQLite
    database DB and prints ``WRITE-OK`` or ``WRITE-REJECTED <hwm>``; then waits for its
    handle's loss signal and prints ``LOST <reason>`` / ``STILL-HELD``.

``write URL NAME TTL DB``
    The next holder: acquire NAME (wait up to 60 s), write through the gate, print
    ``WROTE <fence>``, release.

``pause-release URL NAME TTL ROUNDS FLAVOUR``
    ROUNDS times (FLAVOUR ``sync``: LockClient, ``async``: AsyncLockClient): acquire NAME with
    TTL seconds, print ``ACQUIRED <round>``, block on stdin (the parent SIGSTOPs us past the
    TTL and queues a line before SIGCONT), release at once on waking, wait a little for the
    loss callback and print ``RELEASED <outcome> <lost|not-lost> <reason> <on_lost calls>
    <idle|busy>`` (idle: the client has nothing left in flight).

URL may be ``redis+sentinel://HOST:PORT,.../MASTER`` (then the clients use the executor).

``handoff URL NAME TTL WAIT HOLD``
    Until killed: acquire NAME (TTL seconds, renewed automatically; waiting up to WAIT), print
    ``ACQUIRED <fence> <monotonic time>``, hold it HOLD seconds, print ``RELEASING <fence>``,
    release, and let a waiter take it (20 ms) before asking again; a wait that runs out prints ``TIMEOUT <monotonic time>``. The parent SIGSTOPs
    whichever worker holds the lock (its renewals stop with it).

``loop URL NAME SECONDS WORKDIR``
    Keep acquiring/releasing NAME (short waits, short TTL) until WORKDIR/stop exists (at most
    SECONDS) while Redis may be killed and restarted; every grant is written through the FencingGate on WORKDIR/gate.db and
    its fence appended to WORKDIR/grants-<pid> (and ``<monotonic time> <fence>`` to
    WORKDIR/times-<pid>); every failure is counted. Prints
    ``DONE grants=<n> failures=<m> lost=<k>``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

from leasehold import LockClient, errors
from leasehold.aio import AsyncLockClient
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService
from leasehold.fencing import FencingGate

logging.basicConfig(level=logging.ERROR, stream=sys.stderr)


def say(*parts: object) -> None:
    print(*parts, flush=True)


# LEASEHOLD_TEST_REDIS=executor: the clients drive the core's Redis protocol (RedisExecutor).
EXECUTOR = os.environ.get("LEASEHOLD_TEST_REDIS") == "executor"


def client_for(url: str, timeout: float = 1.0) -> LockClient:
    if url.startswith("redis+cluster://"):
        from leasehold.backends.redis_cluster_executor import RedisClusterExecutor

        return LockClient(RedisClusterExecutor(url=url, socket_timeout=timeout, socket_connect_timeout=timeout))
    if EXECUTOR or url.startswith("redis+sentinel://"):  # Sentinel: the executor only
        from leasehold.backends.redis_executor import RedisExecutor

        return LockClient(RedisExecutor(url=url, socket_timeout=timeout, socket_connect_timeout=timeout))
    return LockClient(RedisLockService.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout))


def gate_for(db: str) -> FencingGate:
    conn = sqlite3.connect(db, timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS writes (token INTEGER, pid INTEGER)")
    conn.commit()
    gate = FencingGate(conn)
    gate.ensure_schema()
    return gate


def contend(url: str, name: str, iterations: int, workdir: str) -> None:
    counter = Path(workdir) / "counter"
    grants = Path(workdir) / "grants"
    rnd = random.Random(os.getpid())
    with client_for(url) as client:
        for _ in range(iterations):
            with client.acquire(name, ttl=10.0, wait=60.0) as lock:
                value = int(counter.read_text() or "0")
                time.sleep(rnd.random() * 0.002)
                counter.write_text(str(value + 1))
                with grants.open("a") as f:
                    f.write(f"{lock.fencing_token} {os.getpid()}\n")
    say("DONE")


def hold(url: str, name: str, ttl: float, db: str) -> None:
    gate = gate_for(db)
    with client_for(url) as client:
        lock = client.acquire(name, ttl=ttl, wait=30.0)
        say("ACQUIRED", lock.fencing_token)
        line = sys.stdin.readline().strip()  # the parent SIGSTOPs us while we wait here
        if line == "write":
            try:
                with gate.guard(name, lock.fencing_token) as cur:
                    cur.execute("INSERT INTO writes VALUES (?, ?)", (lock.fencing_token, os.getpid()))
                say("WRITE-OK")
            except errors.StaleFencingToken as e:
                say("WRITE-REJECTED", gate.high_water_mark(name), type(e).__name__)
        if lock.lost.wait(30.0):
            say("LOST", lock.lost_reason, "held" if lock.is_held() else "not-held")
        else:
            say("STILL-HELD")
        lock.release()


def write(url: str, name: str, ttl: float, db: str) -> None:
    gate = gate_for(db)
    with client_for(url) as client:
        with client.acquire(name, ttl=ttl, wait=60.0) as lock:
            with gate.guard(name, lock.fencing_token) as cur:
                cur.execute("INSERT INTO writes VALUES (?, ?)", (lock.fencing_token, os.getpid()))
            say("WROTE", lock.fencing_token)


def pause_release(url: str, name: str, ttl: float, rounds: int) -> None:
    with client_for(url) as client:
        for i in range(rounds):
            calls: list[object] = []
            lock = client.acquire(name, ttl=ttl, wait=30.0, on_lost=calls.append)
            say("ACQUIRED", i)
            sys.stdin.readline()  # stopped here; the line is waiting when we resume
            outcome = lock.release()
            end = time.monotonic() + 5.0
            while not calls and time.monotonic() < end:
                time.sleep(0.01)
            time.sleep(0.2)  # a second call would show up now
            state = "lost" if lock.lost.is_set() else "not-lost"
            idle = "idle" if client.wait_idle(10.0) else "busy"  # the cleanup release finished
            say("RELEASED", outcome, state, lock.lost_reason, len(calls), idle)


async def pause_release_async(url: str, name: str, ttl: float, rounds: int) -> None:
    service: object
    if EXECUTOR:
        from leasehold.backends.redis_executor_async import AsyncRedisExecutor

        service = AsyncRedisExecutor(url=url, socket_timeout=1.0, socket_connect_timeout=1.0)
    else:
        service = AsyncRedisLockService.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    async with AsyncLockClient(service) as client:  # type: ignore[arg-type]
        for i in range(rounds):
            calls: list[object] = []
            lock = await client.acquire(name, ttl=ttl, wait=30.0, on_lost=calls.append)
            say("ACQUIRED", i)
            await asyncio.to_thread(sys.stdin.readline)
            outcome = await lock.release()
            end = time.monotonic() + 5.0
            while not calls and time.monotonic() < end:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            state = "lost" if lock.lost.is_set() else "not-lost"
            idle = "idle" if await client.wait_idle(10.0) else "busy"
            say("RELEASED", outcome, state, lock.lost_reason, len(calls), idle)


def loop(url: str, name: str, seconds: float, workdir: str) -> None:
    gate = gate_for(str(Path(workdir) / "gate.db"))
    out = Path(workdir) / f"grants-{os.getpid()}"
    times = Path(workdir) / f"times-{os.getpid()}"
    grants = failures = lost = stale = 0
    end = time.monotonic() + seconds
    stop = Path(workdir) / "stop"
    with client_for(url, timeout=0.5) as client:
        while time.monotonic() < end and not stop.exists():
            try:
                lock = client.acquire(name, ttl=1.0, wait=1.0)
            except (errors.LockTimeout, errors.AcquireCancelled):
                failures += 1
                continue
            grants += 1
            with out.open("a") as f:
                f.write(f"{lock.fencing_token}\n")
            with times.open("a") as f:  # CLOCK_MONOTONIC: one clock for every process
                f.write(f"{time.monotonic()} {lock.fencing_token}\n")
            try:
                with gate.guard(name, lock.fencing_token) as cur:
                    cur.execute("INSERT INTO writes VALUES (?, ?)", (lock.fencing_token, os.getpid()))
            except errors.StaleFencingToken:
                stale += 1
            time.sleep(0.01)
            if lock.lost.is_set():
                lost += 1
            lock.release()
    say(f"DONE grants={grants} failures={failures} lost={lost} stale={stale}")


def handoff(url: str, name: str, ttl: float, wait: float, hold: float) -> None:
    with client_for(url) as client:
        while True:
            try:
                lock = client.acquire(name, ttl=ttl, wait=wait)
            except errors.LockTimeout:
                say("TIMEOUT", time.monotonic())
                continue
            # CLOCK_MONOTONIC: one clock for every process on the machine.
            say("ACQUIRED", lock.fencing_token, time.monotonic())
            time.sleep(hold)
            say("RELEASING", lock.fencing_token)
            lock.release()
            time.sleep(0.02)  # the woken waiter's turn (a release then an instant acquire barges)


def main(argv: list[str]) -> None:
    mode = argv[1]
    if mode == "contend":
        contend(argv[2], argv[3], int(argv[4]), argv[5])
    elif mode == "hold":
        hold(argv[2], argv[3], float(argv[4]), argv[5])
    elif mode == "write":
        write(argv[2], argv[3], float(argv[4]), argv[5])
    elif mode == "pause-release":
        if argv[6] == "async":
            asyncio.run(pause_release_async(argv[2], argv[3], float(argv[4]), int(argv[5])))
        else:
            pause_release(argv[2], argv[3], float(argv[4]), int(argv[5]))
    elif mode == "handoff":
        handoff(argv[2], argv[3], float(argv[4]), float(argv[5]), float(argv[6]))
    elif mode == "loop":
        loop(argv[2], argv[3], float(argv[4]), argv[5])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)

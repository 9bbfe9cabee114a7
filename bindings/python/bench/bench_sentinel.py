"""Takeover time after a Redis Sentinel failover: leasehold's ``RedisExecutor.from_sentinel``
vs redis-py ``Lock`` over ``Sentinel.master_for``.

Run (from bindings/python, after `cargo build --release` and ./setup-venv.sh)::

    .venv/bin/python bench/bench_sentinel.py --reps 5

Each repetition starts a fresh topology with ``scripts/redis-sentinel-test.sh`` (1 master,
1 replica, 3 sentinels, quorum 2, down-after-milliseconds 1000: a failover uses up the
only replica), then, for one library:

1. a holder acquires the lock (TTL 10 s) and a waiter starts waiting for it (each its own
   client, both finding the master through the sentinels, socket timeouts 0.5 s);
2. the master is SIGKILLed, and at the same instant the holder releases;
3. the time from the kill to the waiter's acquire returning is the takeover time.

Both wait in their idiomatic way: leasehold's waiter is one ``acquire(wait=60)`` (the core
retries the release and the acquire through the outage; a release wakes the next waiter);
redis-py's waiter is ``Lock.acquire(blocking_timeout=60)`` (polling every ``sleep=0.1`` s)
retried on ``ConnectionError``/``TimeoutError``, and its holder retries the release on
those errors every 0.1 s (``Lock.release()`` forgets its token before sending, so the retries
call ``Lock.do_release(token)``; ``LockError``: the key did not survive the failover, nothing
to release). Libraries alternate between repetitions; the script prints the median and range.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import redis
import redis.exceptions
from redis.sentinel import Sentinel

from leasehold import LockClient
from leasehold.backends.redis_executor import RedisExecutor

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "redis-sentinel-test.sh"
TTL = 10.0
OPTS: dict[str, Any] = dict(socket_timeout=0.5, socket_connect_timeout=0.5)
RETRY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class Topology:
    def __init__(self, d: Path) -> None:
        self.dir = d
        subprocess.run([str(SCRIPT), "start", str(d)], check=True, stdout=subprocess.DEVNULL)
        fields = dict(line.split(" ", 1) for line in (d / "addresses").read_text().splitlines())
        self.name = fields["name"]
        self.sentinels = fields["sentinels"]

    def pid(self, node: str) -> int:
        return int((self.dir / node / "pid").read_text())

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.dir)], check=False, stdout=subprocess.DEVNULL)


def leasehold_run(t: Topology, kill: Callable[[], float]) -> tuple[float, float]:
    """Returns (takeover, release done) in seconds after the kill."""
    holder = LockClient(RedisExecutor.from_sentinel(t.sentinels, t.name, **OPTS))
    waiter = LockClient(RedisExecutor.from_sentinel(t.sentinels, t.name, **OPTS))
    got: list[float] = []
    try:
        h = holder.acquire("takeover", ttl=TTL)

        def wait() -> None:
            w = waiter.acquire("takeover", ttl=TTL, wait=60)
            got.append(time.perf_counter())
            w.release()

        th = threading.Thread(target=wait, daemon=True)
        th.start()
        time.sleep(0.5)
        t0 = kill()
        h.release(timeout=30)
        released = time.perf_counter() - t0
        th.join(70)
        if not got:
            raise RuntimeError("the leasehold waiter did not get the lock")
        return got[0] - t0, released
    finally:
        holder.close()
        waiter.close()


def redis_py_run(t: Topology, kill: Callable[[], float]) -> tuple[float, float]:
    hosts = [(h, int(p)) for h, p in (s.rsplit(":", 1) for s in t.sentinels.split(","))]
    holder_r = Sentinel(hosts, sentinel_kwargs=OPTS).master_for(t.name, **OPTS)
    waiter_r = Sentinel(hosts, sentinel_kwargs=OPTS).master_for(t.name, **OPTS)
    got: list[float] = []
    lock = holder_r.lock("takeover", timeout=TTL)
    if not lock.acquire(blocking=False):
        raise RuntimeError("redis-py holder could not acquire")

    def wait() -> None:
        wl = waiter_r.lock("takeover", timeout=TTL, sleep=0.1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if wl.acquire(blocking_timeout=max(0.0, deadline - time.monotonic())):
                    got.append(time.perf_counter())
                    try:
                        wl.release()
                    except redis.exceptions.RedisError:
                        pass
                    return
            except RETRY:
                time.sleep(0.1)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    time.sleep(0.5)
    token = lock.local.token
    t0 = kill()
    release: Callable[[], None] = lock.release
    while True:
        try:
            release()
            break
        except redis.exceptions.LockError:
            break  # not owned: the key did not survive the failover
        except RETRY:
            # Lock.release() forgets the token before sending: retry with it.
            release = lambda: lock.do_release(token)  # noqa: E731
            time.sleep(0.1)
    released = time.perf_counter() - t0
    th.join(70)
    holder_r.close()
    waiter_r.close()
    if not got:
        raise RuntimeError("the redis-py waiter did not get the lock")
    return got[0] - t0, released


LIBS: dict[str, Callable[[Topology, Callable[[], float]], tuple[float, float]]] = {
    "leasehold (RedisExecutor.from_sentinel)": leasehold_run,
    "redis-py Lock (Sentinel.master_for)": redis_py_run,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per library")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in LIBS}
    print(f"load average at the start {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lh-sentinel-bench-") as tmp:
        for rep in range(a.reps):
            for i, (name, run) in enumerate(LIBS.items()):
                t = Topology(Path(tmp) / f"r{rep}-{i}")
                try:
                    master = t.pid("master")

                    def kill() -> float:
                        t0 = time.perf_counter()
                        os.kill(master, signal.SIGKILL)
                        return t0

                    takeover, released = run(t, kill)
                finally:
                    t.stop()
                res[name].append((takeover, released))
                print(f"rep {rep + 1}: {name}: takeover {takeover * 1000:.0f} ms "
                      f"(holder's release returned after {released * 1000:.0f} ms)", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print(f"\ntakeover after SIGKILL of the master, {a.reps} repetitions each (ms)")
    print("| library | median | min–max | holder's release returned, median |\n|---|---:|---:|---:|")
    for name, rows in res.items():
        tk = [r[0] * 1000 for r in rows]
        rl = [r[1] * 1000 for r in rows]
        print(f"| {name} | {statistics.median(tk):.0f} | {min(tk):.0f}–{max(tk):.0f} | {statistics.median(rl):.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({k: [list(r) for r in v] for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()

"""leasehold's ``EtcdExecutor`` on a real etcd cluster: uncontended lock+unlock, Raft entries
per lock+unlock, handoff latency with 8 waiters.

Run (from bindings/python, after `cargo build --release` and ./setup-venv.sh), on a cluster
started by ``scripts/etcd-test-cluster.sh start DIR 3``::

    .venv/bin/python bench/bench_etcd.py --members "$(cat DIR/endpoints)"

The comparison with etcd's own Go lock (``concurrency.Mutex``) runs this script's
measurements interleaved with the Go ones: ``bindings/go/bench/etcd`` (``go run . -members
URLS -python PATH``) calls it with ``--json MODE`` and reads one JSON line.

- throughput: one ``LockClient(EtcdExecutor(members))``, one name, acquire + release for
  ``--seconds``; cycles per second.
- raft: the raft index of the members (``/v3/maintenance/status``, the highest) before and
  after ``--cycles`` cycles, with nothing else writing: log entries per lock+unlock.
- handoff: 1 holder + 8 waiters, each a thread with its own client; a holder keeps the lock
  ``--hold`` seconds so that the others are queued; timed from the holder's ``release()``
  call to the next holder's ``acquire()`` returning.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request
import uuid

from leasehold import LockClient
from leasehold.backends.etcd_executor import EtcdExecutor

TTL = 10.0


def client(members: str) -> LockClient:
    return LockClient(EtcdExecutor(members))


def throughput(members: str, seconds: float) -> float:
    c = client(members)
    try:
        name = f"bench-tp-{uuid.uuid4().hex[:8]}"
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # warm-up: connections, the first lease
            c.acquire(name, ttl=TTL, wait=60).release()
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            c.acquire(name, ttl=TTL, wait=60).release()
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        c.close()


def raft_index(members: str) -> int:
    hi = 0
    for url in members.split(","):
        req = urllib.request.Request(url.rstrip("/") + "/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(req, timeout=5) as r:
            hi = max(hi, int(json.load(r).get("raftIndex", 0)))
    return hi


def raft_entries(members: str, cycles: int) -> float:
    c = client(members)
    try:
        name = f"bench-raft-{uuid.uuid4().hex[:8]}"
        for _ in range(5):
            c.acquire(name, ttl=TTL, wait=60).release()
        time.sleep(0.2)
        before = raft_index(members)
        for _ in range(cycles):
            c.acquire(name, ttl=TTL, wait=60).release()
        return (raft_index(members) - before) / cycles
    finally:
        c.close()


def handoff(members: str, n: int, hold: float) -> list[float]:
    name = f"bench-h-{uuid.uuid4().hex[:8]}"
    mu = threading.Lock()
    samples: list[float] = []
    state = {"last": 0.0, "done": False}
    errors: list[BaseException] = []

    def run(c: LockClient) -> None:
        try:
            while True:
                h = c.acquire(name, ttl=TTL, wait=60)
                now = time.perf_counter()
                with mu:
                    if state["last"] and not state["done"]:
                        samples.append((now - state["last"]) * 1000)
                        state["done"] = len(samples) >= n
                    stop = state["done"]
                time.sleep(hold)
                with mu:
                    state["last"] = time.perf_counter()
                h.release()
                if stop:
                    return
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            with mu:
                state["done"] = True

    clients = [client(members) for _ in range(9)]
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    return samples


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, -(-len(s) * p // 100) - 1)] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default=os.environ.get("LEASEHOLD_ETCD_ENDPOINTS", ""),
                    help="comma-separated member URLs")
    ap.add_argument("--json", choices=["throughput", "raft", "handoff"],
                    help="run one measurement and print it as one JSON line (for the Go bench)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one throughput round")
    ap.add_argument("--rounds", type=int, default=5, help="throughput rounds (standalone run)")
    ap.add_argument("--cycles", type=int, default=50, help="cycles over which Raft entries are counted")
    ap.add_argument("--handoffs", type=int, default=200)
    ap.add_argument("--hold", type=float, default=0.01, help="seconds each holder keeps the lock")
    a = ap.parse_args()
    if not a.members:
        ap.error("--members (or LEASEHOLD_ETCD_ENDPOINTS) is required")
    if a.json == "throughput":
        print(json.dumps({"ops_per_s": throughput(a.members, a.seconds)}))
    elif a.json == "raft":
        print(json.dumps({"entries_per_cycle": raft_entries(a.members, a.cycles)}))
    elif a.json == "handoff":
        print(json.dumps({"samples_ms": handoff(a.members, a.handoffs, a.hold)}))
    else:
        print(f"load average {os.getloadavg()[0]:.2f}")
        ops = [throughput(a.members, a.seconds) for _ in range(a.rounds)]
        print(f"uncontended lock+unlock: median {statistics.median(ops):.0f} ops/s "
              f"({min(ops):.0f}–{max(ops):.0f}, {a.rounds} rounds of {a.seconds} s)")
        print(f"Raft log entries per lock+unlock: {raft_entries(a.members, a.cycles):.2f}")
        s = handoff(a.members, a.handoffs, a.hold)
        print(f"handoff, 8 waiters (a thread and a client each): p50 {pct(s, 50):.2f} ms, "
              f"p99 {pct(s, 99):.2f} ms ({len(s)} handoffs)")


if __name__ == "__main__":
    main()

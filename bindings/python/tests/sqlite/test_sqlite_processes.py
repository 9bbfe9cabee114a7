"""SQLiteLockService shared by several OS processes: mutual exclusion, fencing, crashes."""

from __future__ import annotations

import os
import signal
import sqlite3

import pytest
from sqlite_helpers import BOUND, run_workers, spawn_python, wait_until

from leasehold.backends.sqlite import SQLiteLockService
from leasehold.service import Granted, HeldByOther

# Each worker takes the lock N times; inside it does a deliberately slow read-modify-write of a
# counter file and appends its fencing token to a log. Waiting uses the release wake-ups with a
# short bounded fallback, so the test does not depend on them.
WORKER = r"""
import os, sys, threading, time
from leasehold.backends.sqlite import SQLiteLockService
from leasehold.service import Granted
db, counter, log, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
svc = SQLiteLockService(db)
wake = threading.Event()
svc.watch("shared", lambda name: wake.set())
print("ready", flush=True)
sys.stdin.readline()  # start together
for i in range(n):
    tok = os.urandom(16).hex()
    while True:
        wake.clear()
        r = svc.acquire("shared", tok, 30_000)
        if isinstance(r, Granted):
            break
        wake.wait(min(r.retry_after_ms / 1000, 0.05))
    with open(counter) as f:
        v = int(f.read())
    time.sleep(0.002)  # widen the race window: without the lock updates get lost
    with open(counter, "w") as f:
        f.write(str(v + 1))
    with open(log, "a") as f:
        f.write(f"{r.fencing_token} {os.getpid()}\n")
    assert svc.release("shared", tok, b""), "release refused"
svc.close()
print("done", flush=True)
"""


def test_processes_contending_serialize_and_fences_increase(tmp_path):
    db = tmp_path / "locks.sqlite3"
    counter = tmp_path / "counter"
    counter.write_text("0")
    log = tmp_path / "log"
    log.write_text("")
    SQLiteLockService(db).close()  # create the schema once
    workers, per = 4, 15
    run_workers(WORKER, [str(db), str(counter), str(log), str(per)], workers, BOUND * 2)
    assert int(counter.read_text()) == workers * per  # no lost update
    entries = [line.split() for line in log.read_text().splitlines()]
    fences = [int(f) for f, _ in entries]
    assert len(fences) == workers * per
    assert all(a < b for a, b in zip(fences, fences[1:])), fences  # strictly increasing in CS order
    assert len({pid for _, pid in entries}) == workers


HOLDER = r"""
import sys, time
from leasehold.backends.sqlite import SQLiteLockService
svc = SQLiteLockService(sys.argv[1])
g = svc.acquire("crash", "f" * 32, int(sys.argv[2]))
svc.watch("crash", lambda n: None)
print(g.fencing_token, flush=True)
time.sleep(3600)
"""


def test_holder_killed_with_sigkill_frees_after_its_ttl(tmp_path):
    db = tmp_path / "locks.sqlite3"
    ttl_ms = 1_500
    holder = spawn_python(HOLDER, str(db), str(ttl_ms))
    try:
        fence0 = int(holder.stdout.readline())
        svc = SQLiteLockService(db)
        st = svc.status("crash")
        assert st.held and st.holder_pid == holder.pid and st.fencing_token == fence0
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(BOUND) == -signal.SIGKILL
        # Right after the crash the lock is still held: nothing released it.
        first = svc.acquire("crash", "a" * 32, 10_000)
        if isinstance(first, HeldByOther):
            assert first.retry_after_ms is not None and 0 < first.retry_after_ms <= ttl_ms

        def try_take():
            r = svc.acquire("crash", "a" * 32, 10_000)
            return r if isinstance(r, Granted) else None

        g = wait_until(try_take)  # frees once its TTL has run out
        assert g.fencing_token > fence0
        # The dead process's watcher registration is dropped by the next release's wake-up.
        assert svc.release("crash", "a" * 32, b"")
        con = sqlite3.connect(db)
        assert con.execute("SELECT count(*) FROM leasehold_watchers").fetchone()[0] == 0
        con.close()
        svc.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


WAITER = r"""
import sys, threading
from leasehold.backends.sqlite import SQLiteLockService
svc = SQLiteLockService(sys.argv[1])
woke = threading.Event()
svc.watch("w", lambda n: woke.set())
print("watching", flush=True)
print("woke" if woke.wait(float(sys.argv[2])) else "timeout", flush=True)
svc.close()
"""


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"),
                    reason="cross-process wake-ups are Linux only")
def test_release_in_one_process_wakes_a_watcher_in_another(tmp_path):
    db = tmp_path / "locks.sqlite3"
    svc = SQLiteLockService(db)
    svc.acquire("w", "a" * 32, 60_000)
    waiter = spawn_python(WAITER, str(db), str(BOUND))
    try:
        assert waiter.stdout.readline().strip() == "watching"
        assert svc.release("w", "a" * 32, b"")
        out, err = waiter.communicate(timeout=BOUND * 2)
        assert out.strip() == "woke", err
        assert waiter.returncode == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        svc.close()

"""LockClient on SQLiteLockService across OS processes: the full product path on one host
(the core's SQL protocol on one file; each process its own client)."""

from __future__ import annotations

import signal
import sqlite3

from sqlite_helpers import BOUND, run_workers, spawn_python

from leasehold.backends.sqlite import SQLiteLockService
from leasehold.client import LockClient
from leasehold.fencing import FencingGate

# Each worker process: its own LockClient; a read-modify-write of a counter in an application
# database through the fencing gate, inside the lock; logs the fencing token it wrote with.
WORKER = r"""
import sqlite3, sys, time
from leasehold.backends.sqlite import SQLiteLockService
from leasehold.client import LockClient
from leasehold.fencing import FencingGate
locks, app, log, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = LockClient(SQLiteLockService(locks))
gate = FencingGate(sqlite3.connect(app, timeout=60, isolation_level=None))
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    with client.acquire("counter", 10, wait=120) as lock:
        with gate.guard("counter", lock.fencing_token) as cur:
            cur.execute("SELECT value FROM counter WHERE id = 1")
            (value,) = cur.fetchone()
            time.sleep(0.002)
            cur.execute("UPDATE counter SET value = ? WHERE id = 1", (value + 1,))
        with open(log, "a") as f:
            f.write(f"{lock.fencing_token}\n")
client.close()
print("done", flush=True)
"""


def test_lockclients_in_several_processes_lose_no_update(tmp_path):
    locks, app, log = tmp_path / "locks.sqlite3", tmp_path / "app.sqlite3", tmp_path / "log"
    SQLiteLockService(locks).close()
    con = sqlite3.connect(app, isolation_level=None)
    con.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
    con.execute("INSERT INTO counter VALUES (1, 0)")
    FencingGate(con).ensure_schema()
    log.write_text("")
    workers, per = 3, 8
    run_workers(WORKER, [str(locks), str(app), str(log), str(per)], workers, BOUND * 4)
    assert con.execute("SELECT value FROM counter WHERE id = 1").fetchone()[0] == workers * per
    tokens = [int(x) for x in log.read_text().split()]
    assert len(tokens) == workers * per
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert FencingGate(con).high_water_mark("counter") == tokens[-1]
    con.close()


HOLDER = r"""
import sys, time
from leasehold.backends.sqlite import SQLiteLockService
from leasehold.client import LockClient
client = LockClient(SQLiteLockService(sys.argv[1]))
lock = client.acquire("crash", 1.5)
print(lock.fencing_token, flush=True)
time.sleep(3600)
"""


def test_lockclient_takes_over_after_holder_is_sigkilled(tmp_path):
    locks = tmp_path / "locks.sqlite3"
    holder = spawn_python(HOLDER, str(locks))
    try:
        first = holder.stdout.readline().strip()
        assert first.isdigit(), first
        svc = SQLiteLockService(locks)
        st = svc.status("crash")
        assert st.held and st.fencing_token == int(first) and st.holder_pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(BOUND)
        with LockClient(svc) as client:
            with client.acquire("crash", 5, wait=BOUND) as lock:  # nothing released it: waits out its TTL
                assert lock.fencing_token > int(first)
                assert lock.is_held()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()

"""Property: workers with random pauses and clock steps writing through the fencing gate.

N workers (each its own LockClient on its own connection to one memory store) run a random
schedule of protected read-modify-writes (acquiring first when they hold nothing), releases,
driver pauses and resumes, clock advances and server clock steps. Workers write with whatever handle they have — including
stale ones after a pause or a server clock step, which is exactly the unsafe case. The
fencing gate must make it safe:

* the tokens of accepted writes, in acceptance order, never decrease;
* no acknowledged write is lost: the counter equals the number of acknowledged writes and
  the log holds exactly their tokens, in order.
"""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasehold import FencingGate, LockClient, LockHandle, LockTimeout, StaleFencingToken
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore

N_WORKERS = 3
TTL = 2.0

worker = st.integers(0, N_WORKERS - 1)
op = st.one_of(
    st.tuples(st.just("write"), worker),  # acquires first when it has no live handle
    st.tuples(st.just("write"), worker),
    st.tuples(st.just("write"), worker),
    st.tuples(st.just("release"), worker),
    st.tuples(st.just("pause"), worker),
    st.tuples(st.just("resume"), worker),
    st.tuples(st.just("advance"), st.floats(0.01, 3.0)),
    st.tuples(st.just("step"), st.floats(0.5, 3.0)),
)


@dataclass
class Worker:
    client: LockClient
    conn: sqlite3.Connection
    gate: FencingGate
    handle: LockHandle | None = None
    paused: bool = False
    attempts: int = field(default=0)


def _write(w: Worker) -> int | None:
    """A protected read-modify-write; returns the token if acknowledged."""
    assert w.handle is not None
    token = w.handle.fencing_token
    try:
        with w.gate.guard("counter", token) as cur:
            cur.execute("SELECT n FROM counter WHERE id = 1")
            (n,) = cur.fetchone()
            cur.execute("UPDATE counter SET n = ? WHERE id = 1", (n + 1,))
            cur.execute("INSERT INTO log (token) VALUES (?)", (token,))
    except StaleFencingToken:
        return None
    return token


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=5, max_size=40))
def test_fenced_writes_are_monotonic_and_never_lost(ops: list[tuple[str, float]]) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "store.db"
        setup = sqlite3.connect(db)
        setup.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        setup.execute("INSERT INTO counter VALUES (1, 0)")
        setup.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL)")
        setup.commit()
        FencingGate(setup).ensure_schema()
        workers = []
        for _ in range(N_WORKERS):
            conn = sqlite3.connect(db, timeout=10)
            conn.execute("PRAGMA synchronous=OFF")  # durability is not under test; fsyncs are slow
            workers.append(
                Worker(LockClient(MemoryLockService(store), clock=clock, release_timeout=1.0), conn, FencingGate(conn))
            )
        acked: list[int] = []
        granted: list[int] = []  # the fencing token of every grant, in grant order
        try:
            for kind, arg in ops:
                if kind == "advance":
                    clock.advance(float(arg))
                elif kind == "step":
                    store.step_clock(float(arg))
                else:
                    w = workers[int(arg)]
                    if kind == "pause" and not w.paused:
                        w.client._set_paused(True)
                        w.paused = True
                    elif kind == "resume" and w.paused:
                        w.client._set_paused(False)
                        w.paused = False
                    elif kind == "write":
                        if not w.paused and (w.handle is None or w.handle.state != "held"):
                            try:
                                w.handle = w.client.acquire("counter", ttl=TTL)
                                granted.append(w.handle.fencing_token)
                            except LockTimeout:
                                pass
                        if w.handle is not None:
                            # Write with whatever handle we have: a paused, stepped-over or
                            # even lost one writes with a stale token. The gate must cope.
                            t = _write(w)
                            if t is not None:
                                acked.append(t)
                    elif kind == "release" and not w.paused and w.handle is not None:
                        w.handle.release()
                        w.handle = None
                for x in workers:
                    if not x.paused:
                        assert x.client.wait_idle(10)
            # Accepted tokens never go down (I6).
            assert acked == sorted(acked)
            # No acknowledged write is lost.
            n = setup.execute("SELECT n FROM counter WHERE id = 1").fetchone()[0]
            logged = [r[0] for r in setup.execute("SELECT token FROM log ORDER BY seq")]
            assert n == len(acked)
            assert logged == acked
            # Every grant of the name got a strictly larger fencing token (I4).
            assert granted == sorted(set(granted))
            assert store.last_fence("counter") == (granted[-1] if granted else 0)
        finally:
            for x in workers:
                x.client._set_paused(False)
                x.client.close(timeout=0.5)
                x.conn.close()
            setup.close()

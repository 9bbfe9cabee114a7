"""Several OS processes against one real redis-server: contention, Kleppmann's paused holder,
and Redis killed and restarted while they run."""

from __future__ import annotations

import bisect
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lh_keys import keys_for

WORKER = str(Path(__file__).resolve().parent / "lh_redis_worker.py")


class Proc:
    """A worker process whose stdout lines are collected by a reader thread."""

    def __init__(self, args: list[str], env: dict[str, str], stdin: bool = False) -> None:
        self.p = subprocess.Popen(
            [sys.executable, WORKER, *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    @staticmethod
    def _pump(stream, q) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            q.put(line.rstrip("\n"))

    def _pump_err(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.err.append(line)

    def expect(self, prefix: str, timeout: float = 90.0) -> str:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line starting with {prefix!r}; got {self.seen}; stderr:\n{''.join(self.err)}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def finish(self, timeout: float = 120.0) -> int:
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker {self.p.pid} hung; saw {self.seen}; stderr:\n{''.join(self.err)}")

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.p.kill()
            self.p.wait(timeout=10)


@pytest.fixture(params=["service", "executor"])
def worker_env(worker_env: dict[str, str], request: pytest.FixtureRequest) -> dict[str, str]:
    """Every process test runs with the service and with the executor (see the worker)."""
    return dict(worker_env, LEASEHOLD_TEST_REDIS=request.param)


@pytest.fixture
def procs():
    made: list[Proc] = []
    yield made
    for p in made:
        p.kill()


def test_processes_contending_get_increasing_fences_and_lose_no_update(redis_server, r, tmp_path, worker_env, procs):
    workers, iterations = 3, 15
    (tmp_path / "counter").write_text("0")
    for _ in range(workers):
        procs.append(Proc(["contend", redis_server.url, "counter", str(iterations), str(tmp_path)], worker_env))
    for p in procs:
        p.expect("DONE", timeout=180)
        assert p.finish() == 0, "".join(p.err)
    assert int((tmp_path / "counter").read_text()) == workers * iterations, "an update was lost"
    lines = (tmp_path / "grants").read_text().split("\n")[:-1]
    fences = [int(line.split()[0]) for line in lines]
    pids = {line.split()[1] for line in lines}
    assert len(fences) == workers * iterations and len(pids) == workers
    assert all(b > a for a, b in zip(fences, fences[1:])), "fencing tokens must increase grant after grant"
    assert not r.exists(keys_for("counter").lock), "every lock was released"


def test_kleppmann_paused_holder_is_fenced_off_and_learns_it_lost(redis_server, r, tmp_path, worker_env, procs):
    db = str(tmp_path / "gate.db")
    holder = Proc(["hold", redis_server.url, "resource", "1.0", db], worker_env, stdin=True)
    procs.append(holder)
    fence_a = int(holder.expect("ACQUIRED").split()[1])
    os.kill(holder.p.pid, signal.SIGSTOP)  # a GC pause / VM stall past the TTL
    try:
        # Its lease runs out in Redis while it is frozen; the next process takes over and writes.
        writer = Proc(["write", redis_server.url, "resource", "5.0", db], worker_env)
        procs.append(writer)
        fence_b = int(writer.expect("WROTE").split()[1])
        assert writer.finish() == 0, "".join(writer.err)
    finally:
        os.kill(holder.p.pid, signal.SIGCONT)
    assert fence_b > fence_a
    holder.send("write")  # it resumes and carries on with the write it was about to do
    rejected = holder.expect("WRITE-")
    assert rejected.startswith("WRITE-REJECTED"), rejected
    assert int(rejected.split()[1]) == fence_b
    lost = holder.expect("LOST")
    assert lost.split()[1] in ("expired", "rejected", "fail_budget"), lost
    assert lost.split()[2] == "not-held"
    assert holder.finish() == 0, "".join(holder.err)
    rows = sqlite3.connect(db).execute("SELECT token FROM writes ORDER BY rowid").fetchall()
    assert rows == [(fence_b,)], "only the current holder's write got through"


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_release_right_after_a_pause_past_the_ttl_ends_lost(redis_server, r, worker_env, procs, flavour):
    """SIGSTOP a holder past its TTL with its release() queued: on waking it releases at once,
    racing its own driver. Whoever runs first, the lease ends lost, with its loss signal."""
    ttl, rounds = 1.0, 3
    holder = Proc(["pause-release", redis_server.url, "paused", str(ttl), str(rounds), flavour], worker_env, stdin=True)
    procs.append(holder)
    for i in range(rounds):
        holder.expect(f"ACQUIRED {i}")
        os.kill(holder.p.pid, signal.SIGSTOP)
        try:
            time.sleep(ttl + 0.7)  # past the validity (and the key's TTL in Redis)
            holder.send("release")  # waiting in the pipe when it resumes
        finally:
            os.kill(holder.p.pid, signal.SIGCONT)
        released = holder.expect("RELEASED").split()
        assert released[1:3] == ["lost", "lost"] and released[3] in ("expired", "fail_budget"), released
        assert released[4] == "1", f"on_lost must fire exactly once: {released}"
        assert released[5] == "idle", f"nothing left in flight: {released}"
    assert holder.finish() == 0, "".join(holder.err)
    assert not r.exists(keys_for("paused").lock)


@pytest.mark.parametrize("persistence", [False, True], ids=["no-persistence", "aof"])
def test_redis_killed_and_restarted_mid_run(redis_factory, tmp_path, worker_env, procs, persistence):
    srv = redis_factory(persistence=persistence)
    rc = srv.client()
    fence_key = keys_for("busy").fence
    for _ in range(2):
        procs.append(Proc(["loop", srv.url, "busy", "120", str(tmp_path)], worker_env))
    # Let them work, then kill Redis without warning.
    end = time.monotonic() + 60
    while rc.get(fence_key) is None or int(rc.get(fence_key)) == 0:
        assert time.monotonic() < end, "no grant before the kill"
        time.sleep(0.05)
    time.sleep(0.5)
    before = int(rc.get(fence_key))
    srv.kill()
    time.sleep(1.0)  # an outage: every call fails (connection refused)
    srv.start()
    rc = srv.client()
    persisted = rc.get(fence_key)
    if persistence:
        assert persisted is not None and int(persisted) >= before, "the AOF kept the fence counter"
    else:
        assert persisted is None or int(persisted) > before, "the fence went backwards"
    floor = int(persisted) if persisted is not None else before
    end = time.monotonic() + 60
    while True:  # a grant made after the restart
        v = rc.get(fence_key)
        if v is not None and int(v) > floor:
            break
        assert time.monotonic() < end, "nobody re-acquired after the restart"
        time.sleep(0.05)
    time.sleep(0.5)  # a few more grants after the restart
    (tmp_path / "stop").touch()
    results = []
    for p in procs:
        results.append(p.expect("DONE", timeout=120))
        assert p.finish() == 0, "".join(p.err)
    print("workers:", results, "fence before kill:", before)
    grants_total = sum(int(line.split()[1].split("=")[1]) for line in results)
    assert grants_total > 0
    all_fences: list[int] = []
    for f in tmp_path.glob("grants-*"):
        fences = [int(x) for x in f.read_text().split()]
        assert all(b > a for a, b in zip(fences, fences[1:])), f"{f.name}: tokens went backwards"
        all_fences += fences
    assert len(all_fences) == len(set(all_fences)), "two grants shared a fencing token"
    assert any(x > floor for x in all_fences), "leases were re-acquired after the restart"
    rows = [t for (t,) in sqlite3.connect(str(tmp_path / "gate.db")).execute("SELECT token FROM writes ORDER BY rowid")]
    assert rows and all(b >= a for a, b in zip(rows, rows[1:])), "the gate accepted an older token"


def _stopped(pid: int) -> bool:
    """The process is in the stopped state (SIGSTOP took effect)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_holder_frozen_after_handoffs_is_taken_over_at_its_expiry(redis_server, r, worker_env, procs):
    """Four processes hand a 1 s lock round (wait 10 s, hold 30 ms, renewed automatically);
    then whichever holds it is SIGSTOPped. Another one must get it once the frozen holder's
    grant runs out (TTL + 1 s at most), not when its own 10 s wait ends."""
    ttl, workers, warm_up = 1.0, 4, 12
    events: queue.Queue[tuple[int, str]] = queue.Queue()

    def forward(i: int, p: Proc) -> None:
        while True:
            events.put((i, p.lines.get()))

    for i in range(workers):
        p = Proc(["handoff", redis_server.url, "frozen-holder", str(ttl), "10", "0.03"], worker_env)
        procs.append(p)
        threading.Thread(target=forward, args=(i, p), daemon=True).start()

    def next_event(until: float, timeouts: bool = False) -> tuple[int, list[str]] | None:
        try:
            i, line = events.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return None
        parts = line.split()
        assert timeouts or parts[0] != "TIMEOUT", f"worker {i}'s 10 s wait ran out before the freeze: {line}"
        return i, parts

    # (grant time, worker, fence), in the order of the workers' CLOCK_MONOTONIC stamps: the
    # lines of four pipes may reach this process in another order under load.
    grants: list[tuple[float, int, int]] = []
    frozen: tuple[int, int, float] | None = None  # (worker, fence, grant time)

    def record(worker: int, parts: list[str]) -> None:
        g = (float(parts[2]), worker, int(parts[1]))
        k = bisect.bisect(grants, g)
        grants.insert(k, g)
        before, after = grants[k - 1 : k], grants[k + 1 : k + 2]
        assert all(b[2] < g[2] for b in before) and all(g[2] < a[2] for a in after), (
            f"fences went backwards in grant order: {before} {g} {after}"
        )
    end = time.monotonic() + 120
    while frozen is None:
        ev = next_event(end)
        assert ev is not None, f"no freeze within 120 s; grants {grants}; stderr: {[''.join(p.err) for p in procs]}"
        i, parts = ev
        if parts[0] != "ACQUIRED":
            continue
        fence = int(parts[1])
        record(i, parts)
        handed = len(grants) > 1 and grants[-1][1:] == (i, fence) and grants[-2][1] != i
        # Freeze a holder that got the lock through a handoff, once every worker had it.
        if not handed or len(grants) < warm_up or len({w for _, w, _ in grants}) < workers:
            continue
        # Freeze it while it holds: if it printed RELEASING before the stop took effect, it
        # was too late; resume it and try with a later grant.
        pid = procs[i].p.pid
        os.kill(pid, signal.SIGSTOP)
        while not _stopped(pid):
            time.sleep(0.001)
        time.sleep(0.1)  # its last lines reach the pipe reader
        missed = False
        while True:
            try:
                j, line = events.get_nowait()
            except queue.Empty:
                break
            p2 = line.split()
            if j == i and p2[0] == "RELEASING":
                missed = True
            elif p2[0] == "ACQUIRED":
                record(j, p2)
        if missed:
            os.kill(pid, signal.SIGCONT)
            continue
        assert grants[-1][1:] == (i, fence), f"someone acquired while worker {i} holds {fence}: {grants[-3:]}"
        frozen = (i, fence, float(parts[2]))

    fi, ffence, granted_at = frozen
    handoffs = sum(1 for a, b in zip(grants, grants[1:]) if a[1] != b[1])
    try:
        taken = None
        # Past the waiters' 10 s waits: a late takeover is measured too (a wait that runs out
        # is retried by its worker).
        until = time.monotonic() + ttl + 15.0
        while taken is None:
            ev = next_event(until, timeouts=True)
            assert ev is not None, f"nobody took over from frozen worker {fi} (fence {ffence}) within {ttl + 15} s"
            j, parts = ev
            assert j != fi, f"the frozen worker said {parts}"
            if parts[0] == "ACQUIRED":
                taken = (j, int(parts[1]), float(parts[2]))
    finally:
        os.kill(procs[fi].p.pid, signal.SIGCONT)
    tj, tfence, taken_at = taken
    delay = taken_at - granted_at
    print(
        f"\n{len(grants)} grants ({handoffs} handoffs between processes) before the freeze; worker {fi} "
        f"frozen holding fence {ffence}; worker {tj} took over {delay * 1000:.0f} ms after that grant "
        f"(fence {tfence})"
    )
    assert tfence > ffence
    # Not before the frozen holder's grant ran out (its key's TTL starts a little before the
    # worker's report), and soon after it.
    assert ttl - 0.2 < delay < ttl + 1.0, f"taken over {delay:.3f} s after the frozen holder's grant"

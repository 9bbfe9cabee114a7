"""History harness orchestrator: runs matrix cells (backend x workload x fault), checks each history.

    run.py [--matrix short|long] [--cell ID ...] [--seed N] [--seeds N] [--duration-ms N]
           [--go GO_WORKER] [--cpp CPP_WORKER] [--out DIR] [--require-servers] [--list]

A cell ID is BACKEND/WORKLOAD/FAULT[/unfenced], e.g. ``redis/lock-set/pause/unfenced``. Each run
starts the servers it needs on free loopback ports, starts workers in every language given
(Python always), injects its fault on a schedule drawn from the seed, stops the workers, reads
the fenced set's final state, merges the histories and runs check.py. A fenced cell passes with
0 violations; an unfenced control passes only if the checker found a stale write or a lost
update. A failing run's history, final state, seed and schedule go to --out; ``--cell ID --seed
N`` replays its schedule. See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check  # noqa: E402
import servers  # noqa: E402
from proxy import Proxy  # noqa: E402

SET_VIOLATIONS = {"stale write accepted", "lost update"}
# Faults after which validity windows may overlap: a paused or clock-stepped holder, or a
# server that forgets grants (no persistence, asynchronous replication).
NO_EXCLUSION = {"pause", "clock-step", "restart", "master-kill", "member-stop"}
# Faults after which the service itself may grant a name twice while the first holder can
# still renew where it is: a killed master restarted before the sentinels demote it
# (asynchronous replication), an etcd member paused and resumed as a stale leader (Jepsen's
# finding on etcd locks). Only the fence protects the resource there; fences and the fenced
# set are still checked.
NO_DETECTION = {"master-kill", "member-stop"}
BACKENDS = ["sqlite", "postgres", "redis", "redis-sentinel", "redis-cluster", "etcd"]
FAULTS = {
    "sqlite": ["none", "pause", "kill"],
    "postgres": ["none", "pause", "kill", "restart-durable", "proxy-drop"],
    "redis": ["none", "pause", "kill", "restart", "restart-durable", "proxy-drop", "clock-step"],
    "redis-sentinel": ["master-kill"],
    "redis-cluster": ["master-kill"],
    "etcd": ["none", "pause", "leader-kill", "member-stop", "proxy-drop"],
}
EXTRA = ["redis/lock/none", "etcd/lock/kill"]


def matrix() -> list[str]:
    cells = []
    for b in BACKENDS:
        cells.append(f"{b}/lock-set/pause/unfenced")
        cells += [f"{b}/lock-set/{f}" for f in FAULTS[b]]
    return cells + EXTRA


@dataclass
class Cell:
    backend: str
    workload: str
    fault: str
    unfenced: bool

    @classmethod
    def parse(cls, s: str) -> "Cell":
        parts = s.split("/")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "unfenced"):
            raise SystemExit(f"run.py: bad cell {s!r} (BACKEND/WORKLOAD/FAULT[/unfenced])")
        b, w, f = parts[:3]
        known = FAULTS.get(b, []) + ["none", "pause", "kill"]
        if b not in BACKENDS or w not in ("lock-set", "lock") or f not in known:
            raise SystemExit(f"run.py: unknown cell {s!r}; see --list")
        return cls(b, w, f, len(parts) == 4)

    def __str__(self) -> str:
        return f"{self.backend}/{self.workload}/{self.fault}" + ("/unfenced" if self.unfenced else "")

    @property
    def exclusion(self) -> bool:
        return not self.unfenced and self.fault not in NO_EXCLUSION

    @property
    def detection(self) -> bool:
        return self.fault not in NO_DETECTION


@dataclass
class Worker:
    p: str
    lang: str
    proc: subprocess.Popen[bytes]
    history: str


@dataclass
class Result:
    cell: Cell
    seed: int
    langs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    violations: list[check.Violation] = field(default_factory=list)
    faults: int = 0
    error: str | None = None
    elapsed: float = 0.0

    @property
    def passed(self) -> bool:
        if self.error is not None:
            return False
        if self.cell.unfenced:
            # The gate's checks must fire; the lock service's own (fences, detection,
            # liveness) still hold, as the control changes only the resource.
            return any(v.check in SET_VIOLATIONS for v in self.violations) and not self.unexpected
        return not self.violations

    @property
    def unexpected(self) -> list[check.Violation]:
        """Violations a fenced run must not have; in a control, those outside the gate's checks."""
        if self.cell.unfenced:
            return [v for v in self.violations if v.check not in SET_VIOLATIONS]
        return self.violations


class Env:
    """Servers shared by the cells of one invocation (started on first use)."""

    def __init__(self, tmp: str, go: str | None, cpp: str | None) -> None:
        self.tmp = tmp
        self.langs = {"py": [sys.executable, os.path.join(HERE, "worker.py")]}
        if go:
            self.langs["go"] = [go]
        if cpp:
            self.langs["cpp"] = [cpp]
        self.unsupported: set[tuple[str, str]] = set()
        self.servers: dict[str, Any] = {}
        self.flags: dict[tuple[str, str], bool] = {}
        self.next_index = 0

    def has_flag(self, lang: str, flag: str) -> bool:
        """Does the worker's --help mention an optional flag?"""
        if (lang, flag) not in self.flags:
            res = subprocess.run(self.langs[lang] + ["--help"], capture_output=True, text=True, timeout=30)
            self.flags[(lang, flag)] = flag.lstrip("-") in res.stdout + res.stderr
        return self.flags[(lang, flag)]

    def server(self, kind: str) -> Any:
        if kind not in self.servers:
            make = {
                "postgres": lambda: servers.Postgres(self.tmp),
                "redis": lambda: servers.Redis(self.tmp, persistent=False),
                "redis-durable": lambda: servers.Redis(self.tmp, persistent=True),
                "redis-sentinel": lambda: servers.Sentinel(self.tmp),
                "redis-cluster": lambda: servers.Cluster(self.tmp),
                "etcd": lambda: servers.Etcd(self.tmp),
            }[kind]
            self.servers[kind] = make()
        return self.servers[kind]

    def discard(self, kind: str) -> None:
        s = self.servers.pop(kind, None)
        if s is not None:
            s.stop()

    def stop(self) -> None:
        for kind in list(self.servers):
            try:
                self.discard(kind)
            except Exception as e:  # keep stopping the others
                print(f"run.py: stopping {kind}: {e}", file=sys.stderr)


def tail_event(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            ev = json.loads(line)
            if ev.get("f") not in ("lost", "clock-step"):
                return ev
        except json.JSONDecodeError:
            continue
    return None


def phase(ev: dict[str, Any] | None) -> str:
    if ev is None:
        return "?"
    if ev.get("f") == "acquire" and ev.get("type") == "ok":
        return "hold"
    if ev.get("f") == "write" and ev.get("type") == "invoke":
        return "write"
    return "other"


class Run:
    """One run of one cell."""

    def __init__(self, env: Env, cell: Cell, seed: int, duration_ms: int, long: bool) -> None:
        self.env, self.cell, self.seed, self.long = env, cell, seed, long
        self.rng = random.Random(seed)
        self.duration_ms = duration_ms
        self.ttl_ms = 1000
        self.dir = tempfile.mkdtemp(prefix=f"{str(cell).replace('/', '-')}-", dir=env.tmp)
        self.name = f"h{seed % 100000}-{time.monotonic_ns() % 10**9}"
        self.nemesis: list[dict[str, Any]] = []
        self.workers: list[Worker] = []
        self.proxies: list[Proxy] = []
        self.schedule: list[dict[str, Any]] = []
        self.result = Result(cell, seed)

    # -- history -----------------------------------------------------------------------------
    def nem(self, f: str, **kw: Any) -> int:
        t = time.monotonic_ns()
        self.nemesis.append({"p": check.NEMESIS, "t": t, "type": "info", "f": f, **kw})
        return t

    # -- servers -----------------------------------------------------------------------------
    def setup(self) -> None:
        c = self.cell
        self.gate_kind = "sqlite" if c.backend == "sqlite" else "postgres"
        if c.backend == "sqlite":
            self.backend_url = f"sqlite://{self.dir}/locks.db"
            self.server = None
        else:
            kind = c.backend
            if c.backend == "redis" and c.fault == "restart-durable":
                kind = "redis-durable"
            self.kind = kind
            self.server = self.env.server(kind)
            self.backend_url = self.server.url
            if c.fault == "proxy-drop":
                self.proxies = [Proxy(ep, self.rng.randrange(1 << 30)) for ep in self.server.endpoints]
                addrs = [f"127.0.0.1:{p.port}" for p in self.proxies]
                if c.backend == "etcd":
                    self.backend_url = "etcd://" + ",".join(addrs)
                elif c.backend == "redis":
                    self.backend_url = f"redis://{addrs[0]}"
                else:
                    host, port = self.server.endpoints[0]
                    self.backend_url = self.server.url.replace(f"{host}:{port}", addrs[0])
        if c.workload == "lock-set":
            if self.gate_kind == "sqlite":
                self.gate_url = f"sqlite://{self.dir}/gate.db"
            else:
                self.gate_url = self.env.server("postgres").url
        else:
            self.gate_url = None

    # -- workers -----------------------------------------------------------------------------
    def langs(self) -> list[str]:
        """Four workers: one per language available for this cell, the rest Python."""
        mix = [lang for lang in ("py", "go", "cpp") if lang in self.env.langs and (lang, self.key()) not in self.env.unsupported]
        return (mix + ["py"] * 4)[:4]

    def key(self) -> str:
        """What a worker may not support: the backend, the gate, the clock step."""
        gate = self.gate_kind if self.cell.workload == "lock-set" else "-"
        return f"{self.cell.backend}/{gate}" + ("/clock" if self.cell.fault == "clock-step" else "")

    def spawn(self, lang: str) -> Worker:
        i = self.env.next_index
        self.env.next_index += 1
        p = f"{lang}-{i}"
        hist = os.path.join(self.dir, f"{p}.jsonl")
        cmd = self.env.langs[lang] + [
            "--backend", self.backend_url, "--name", self.name, "--process", p, "--history", hist,
            "--workload", self.cell.workload, "--ttl-ms", str(self.ttl_ms), "--wait-ms", "2000",
            "--hold-ms", "100", "--duration-ms", str(self.duration_ms + 60_000),
            "--seed", str(self.rng.randrange(1 << 31)),
        ]  # fmt: skip
        if self.gate_url:
            cmd += ["--gate", self.gate_url]
        if self.cell.unfenced:
            cmd += ["--unfenced"]
        if self.cell.workload == "lock-set" and (self.cell.unfenced or self.cell.fault == "kill") and self.env.has_flag(lang, "--write-hold-ms"):
            cmd += ["--write-hold-ms", "20"]  # widens the read-to-write window
        if self.cell.fault == "clock-step":
            at = self.schedule[0]["at_ms"] if self.schedule else 1000
            cmd += ["--clock-step-at-ms", str(at), "--clock-step-ms", str(2 * self.ttl_ms)]
        err = open(os.path.join(self.dir, f"{p}.stderr"), "wb")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        w = Worker(p, lang, proc, hist)
        self.workers.append(w)
        return w

    def start_workers(self) -> None:
        """Starts the workers; returns once each wrote its start line (the backend is open)."""
        for lang in self.langs():
            self.spawn(lang)
        deadline = time.monotonic() + 30
        while True:
            waiting = False
            for w in list(self.workers):
                rc = w.proc.poll()
                if rc == 3:
                    self.env.unsupported.add((w.lang, self.key()))
                    self.result.skipped.append(w.lang)
                    self.workers.remove(w)
                    if os.path.exists(w.history):
                        os.unlink(w.history)
                    self.spawn("py")
                    waiting = True
                elif rc is not None:
                    raise RuntimeError(f"worker {w.p} exited {rc} at start: {self.stderr(w)}")
                elif tail_event(w.history) is None:
                    waiting = True
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start within 30 s")
            time.sleep(0.05)
        self.result.langs = sorted({w.lang for w in self.workers})

    def stderr(self, w: Worker) -> str:
        with open(os.path.join(self.dir, f"{w.p}.stderr"), "rb") as f:
            return f.read().decode(errors="replace")[-1500:]

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def holder(self, phases: tuple[str, ...], seconds: float = 5.0) -> Worker | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cands = [w for w in self.alive() if phase(tail_event(w.history)) in phases]
            if cands:
                return self.rng.choice(cands)
            time.sleep(0.002)
        return None

    # -- faults ------------------------------------------------------------------------------
    def plan(self) -> None:
        """The seeded schedule: when each fault starts and its parameters."""
        f = self.cell.fault
        if f == "none":
            return
        period = {"master-kill": 12_000, "restart": 4_000, "restart-durable": 4_000}.get(f, 3_000)
        at = 1000 + self.rng.randrange(500)
        count = 0
        while at < self.duration_ms - 1000 or count == 0:
            step: dict[str, Any] = {"at_ms": at, "fault": f}
            if f == "pause":
                # Past TTL + the liveness bound: others must get the name while it sleeps.
                step["pause_ms"] = self.ttl_ms + check.DEFAULT_BOUND_MS + 500 + self.rng.randrange(1000)
            elif f in ("restart", "restart-durable"):
                step["down_ms"] = 200 + self.rng.randrange(800)
            elif f in ("proxy-drop", "member-stop"):
                step["for_ms"] = 1000 + self.rng.randrange(1500)
            self.schedule.append(step)
            count += 1
            if f == "clock-step" or not self.long:
                break
            at += period + self.rng.randrange(1000)

    def inject(self, step: dict[str, Any]) -> None:
        f = step["fault"]
        res = self.result
        if f in ("pause", "kill"):
            phases = ("hold",) if f == "pause" else ("hold", "write")
            if f == "kill" and self.cell.backend == "sqlite":
                phases = ("write",)  # SIGKILL inside the gate's SQLite transaction
            w = self.holder(phases)
            if w is None:
                self.nem("note", error=f"no holder found for {f}")
                return
            if f == "pause":
                self.nem("pause", process=w.p)
                res.faults += 1
                os.kill(w.proc.pid, signal.SIGSTOP)
                time.sleep(step["pause_ms"] / 1000)
                os.kill(w.proc.pid, signal.SIGCONT)
                self.nem("resume", process=w.p)
            else:
                self.nem("kill", process=w.p, error=phase(tail_event(w.history)))
                res.faults += 1
                w.proc.kill()
                w.proc.wait()
                self.spawn(w.lang)
            self.nem("heal")
            return
        if f == "clock-step":
            self.nem("clock-step", error=f"{2 * self.ttl_ms} ms, every Python worker")
            res.faults += 1
            self.nem("heal")
            return
        self.nem("fault", error=f)
        res.faults += 1
        s = self.server
        if f in ("restart", "restart-durable"):
            s.crash()
            time.sleep(step["down_ms"] / 1000)
            s.start()
        elif f == "proxy-drop":
            for p in self.proxies:
                p.dropping = True
            time.sleep(step["for_ms"] / 1000)
            for p in self.proxies:
                p.dropping = False
            self.nem("note", error=f"{sum(p.drops for p in self.proxies)} connections dropped")
        elif f == "leader-kill":
            i = s.leader()
            s.kill(i)
            time.sleep(0.5 + self.rng.random())
            s.restart(i)
        elif f == "member-stop":
            i = s.leader()
            pid = s.pid(i)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(step["for_ms"] / 1000)
            os.kill(pid, signal.SIGCONT)
        elif f == "master-kill":
            if self.cell.backend == "redis-sentinel":
                old = s.kill_master()
                ok = s.wait_failover(old)
            else:
                old = s.kill_master_of(f"lh:{{{self.name}}}")
                ok = s.wait_failover(f"lh:{{{self.name}}}", old)
            self.nem("note", error=f"master {old} killed; failover {'seen' if ok else 'NOT seen'}")
            if not ok:
                raise RuntimeError("no failover within 30 s")
            s.restart_killed()  # back as a replica, for the next kill
            self.nem("heal")
            self.nem("note", error=f"{old} restarted")
            return
        self.nem("heal")

    # -- the run -----------------------------------------------------------------------------
    def go(self) -> Result:
        t0 = time.monotonic()
        try:
            self.setup()
            self.plan()
            self.start_workers()
            begin = self.nem("begin")
            for step in self.schedule:
                delay = begin / 1e9 + step["at_ms"] / 1000 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.inject(step)
            # Run for the duration, then until an acquire succeeded after the last heal (or
            # TTL + bound passed without one: the liveness check then fails).
            heal = max(ev["t"] for ev in self.nemesis if ev["f"] in ("heal", "begin"))
            soonest = begin / 1e9 + self.duration_ms / 1000
            latest = max(soonest, heal / 1e9 + (self.ttl_ms + check.DEFAULT_BOUND_MS) / 1000 + 0.5)
            while time.monotonic() < latest:
                if time.monotonic() >= soonest and self.granted_since(heal):
                    break
                time.sleep(0.1)
            self.nem("end")
        except Exception as e:
            self.result.error = f"{type(e).__name__}: {e}"
        finally:
            self.stop_workers()
            for p in self.proxies:
                p.stop()
        try:
            self.evaluate()
        except Exception as e:
            self.result.error = self.result.error or f"{type(e).__name__}: {e}"
        if self.cell.fault in ("master-kill",) and getattr(self, "server", None) is not None:
            self.env.discard(self.kind)  # the next cell starts from a settled topology
        self.result.elapsed = time.monotonic() - t0
        return self.result

    def granted_since(self, t: int) -> bool:
        for w in self.workers:
            try:
                with open(w.history, encoding="utf-8") as f:
                    for line in f:
                        if '"ok"' in line and '"acquire"' in line and json.loads(line)["t"] > t:
                            return True
            except (OSError, ValueError):
                continue
        return False

    def stop_workers(self) -> None:
        for w in self.alive():
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for w in self.workers:
            left = deadline - time.monotonic()
            try:
                w.proc.wait(timeout=max(0.1, left))
            except subprocess.TimeoutExpired:
                self.nem("kill", process=w.p, error="did not stop on SIGTERM")
                w.proc.kill()
                w.proc.wait()
                self.result.error = self.result.error or f"worker {w.p} did not stop on SIGTERM"

    def final_set(self) -> dict[str, list[int]]:
        if self.gate_kind == "sqlite":
            path = self.gate_url[len("sqlite://") :]  # type: ignore[index]
            conn = sqlite3.connect(path, timeout=30)
            try:
                rows = conn.execute("SELECT value FROM lh_hist_set WHERE resource = ?", (self.name,)).fetchall()
            except sqlite3.OperationalError:
                rows = []
            conn.close()
        else:
            import psycopg

            with psycopg.connect(self.gate_url, connect_timeout=10) as conn:
                try:
                    rows = conn.execute("SELECT value FROM lh_hist_set WHERE resource = %s", (self.name,)).fetchall()
                except psycopg.errors.UndefinedTable:
                    rows = []
        return {self.name: [int(v) for (v,) in rows]}

    def evaluate(self) -> None:
        events: list[dict[str, Any]] = list(self.nemesis)
        for w in self.workers:
            if os.path.exists(w.history):
                with open(w.history, encoding="utf-8") as f:
                    events += check.parse(f)
        self.events = check.merge([events])
        self.final = self.final_set() if self.cell.workload == "lock-set" else None
        self.result.stats = check.stats(self.events)
        if self.result.error is None:
            self.result.violations = check.check(
                self.events, self.final, exclusion=self.cell.exclusion, detection=self.cell.detection, ttl_ms=self.ttl_ms
            )
        bad_exit = [f"{w.p}: {w.proc.returncode}" for w in self.workers if w.proc.returncode not in (0, -9)]
        if bad_exit and self.result.error is None:
            self.result.error = "workers failed: " + ", ".join(bad_exit) + "; " + self.stderr(
                next(w for w in self.workers if w.proc.returncode not in (0, -9))
            )

    def save(self, out: str) -> str:
        d = os.path.join(out, f"{str(self.cell).replace('/', '-')}-seed{self.seed}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "history.jsonl"), "w", encoding="utf-8") as f:
            for ev in getattr(self, "events", []):
                f.write(json.dumps(ev) + "\n")
        with open(os.path.join(d, "final.json"), "w", encoding="utf-8") as f:
            json.dump(getattr(self, "final", None), f)
        with open(os.path.join(d, "schedule.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "cell": str(self.cell),
                    "seed": self.seed,
                    "duration_ms": self.duration_ms,
                    "long": self.long,
                    "schedule": self.schedule,
                    "replay": f"tests/histories/run.py --cell {self.cell} --seed {self.seed} --duration-ms {self.duration_ms}"
                    + (" --long" if self.long else ""),
                },
                f,
                indent=1,
            )
        with open(os.path.join(d, "violations.txt"), "w", encoding="utf-8") as f:
            if self.result.error:
                f.write(f"error: {self.result.error}\n")
            for v in self.result.violations:
                f.write(f"{v}\n")
        for w in self.workers:
            e = os.path.join(self.dir, f"{w.p}.stderr")
            if os.path.exists(e) and os.path.getsize(e):
                with open(e, "rb") as src, open(os.path.join(d, f"{w.p}.stderr"), "wb") as dst:
                    dst.write(src.read())
        return d


def table(results: list[Result]) -> str:
    rows = [("cell", "langs", "histories", "ops", "grants/acq. failed", "writes ok/stale", "losses", "faults", "violations", "verdict")]
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(str(r.cell), []).append(r)
    for cell, rs in by.items():
        viol = sum(len(r.violations) for r in rs)
        kinds = sorted({v.check for r in rs for v in r.violations})
        verdict = "PASS" if all(r.passed for r in rs) else "FAIL"
        if any(r.error for r in rs):
            verdict += " (error)"
        rows.append(
            (
                cell,
                ",".join(sorted({lang for r in rs for lang in r.langs})),
                str(len(rs)),
                str(sum(r.stats.get("ops", 0) for r in rs)),
                f"{sum(r.stats.get('grants', 0) for r in rs)}/{sum(r.stats.get('acquire_fail', 0) for r in rs)}",
                f"{sum(r.stats.get('writes_ok', 0) for r in rs)}/{sum(r.stats.get('writes_stale', 0) for r in rs)}",
                str(sum(r.stats.get("lost", 0) for r in rs)),
                str(sum(r.faults for r in rs)),
                f"{viol}" + (f" ({', '.join(kinds)})" if kinds else ""),
                verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# A control's pause may land outside the holder's read-to-write window: then no stale write
# happened and the history is clean, which says nothing about the checker. Such a control runs
# again with another seed, a bounded number of times; a fault of the lock service's own checks
# (an unexpected violation, an error) is never retried.
CONTROL_ATTEMPTS = 3


def run_cell(env: "Env", cell: "Cell", seed: int, duration: int, long: bool) -> "tuple[Run, Result]":
    for attempt in range(CONTROL_ATTEMPTS):
        run = Run(env, cell, seed + attempt * 1_000_003, duration, long)
        r = run.go()
        caught_nothing = cell.unfenced and r.error is None and not r.violations
        if not caught_nothing or attempt == CONTROL_ATTEMPTS - 1:
            return run, r
        print(f"run.py: {cell} seed {r.seed}: the pause caught no write in flight; again", flush=True)
    raise AssertionError("unreachable")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrix", choices=["short", "long"])
    ap.add_argument("--cell", action="append", default=[])
    ap.add_argument("--seed", type=int, help="first seed (random if omitted; printed)")
    ap.add_argument("--seeds", type=int, default=1, help="runs per cell (seed, seed+1, ...)")
    ap.add_argument("--duration-ms", type=int)
    ap.add_argument("--long", action="store_true", help="repeat faults through the run (the long schedule)")
    ap.add_argument("--go")
    ap.add_argument("--cpp")
    ap.add_argument("--out", default=os.path.join(os.getcwd(), "target", "histories"))
    ap.add_argument("--require-servers", action="store_true", help="a missing server fails (CI)")
    ap.add_argument("--save-all", action="store_true", help="write every run's history to --out, not only failures")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(matrix()))
        return 0
    long = args.long or args.matrix == "long"
    cells = [Cell.parse(c) for c in (args.cell or (matrix() if args.matrix else []))]
    if not cells:
        ap.error("give --matrix or --cell")
    for path in (args.go, args.cpp):
        if path and not os.access(path, os.X_OK):
            raise SystemExit(f"run.py: {path} is not an executable worker")
    duration = args.duration_ms or (15_000 if long else 3_000)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"run.py: seed {seed}; {len(cells)} cell(s) x {args.seeds} run(s), {duration} ms each", flush=True)
    results: list[Result] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lh-histories-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs as its own user and must reach its directory
        env = Env(tmp, args.go, args.cpp)
        try:
            for cell in cells:
                for k in range(args.seeds):
                    try:
                        run, r = run_cell(env, cell, seed + k, duration, long)
                    except servers.ServerMissing as e:
                        msg = f"{cell}: {e} is not installed"
                        if args.require_servers:
                            failures.append(msg)
                        print(f"run.py: SKIP {msg}", flush=True)
                        break
                    results.append(r)
                    verdict = "ok" if r.passed else "FAILED"
                    extra = f" ({', '.join(r.skipped)} unsupported)" if r.skipped else ""
                    print(
                        f"run.py: {cell} seed {r.seed}: {verdict}; {r.stats.get('ops', 0)} ops, "
                        f"{r.faults} faults, {len(r.violations)} violations, {r.elapsed:.1f}s{extra}",
                        flush=True,
                    )
                    if args.save_all and r.passed:
                        run.save(args.out)
                    if not r.passed:
                        d = run.save(args.out)
                        why = r.error or (
                            str(r.unexpected[0]) if r.unexpected else "the control found no stale write or lost update"
                        )
                        failures.append(f"{cell} seed {r.seed}: {why} -> {d}")
        finally:
            env.stop()
    print()
    print(table(results))
    if failures:
        print("\nrun.py: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"\nrun.py: all {len(results)} run(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

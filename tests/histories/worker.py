"""History worker (Python): runs a workload through the public API and records every operation.

    worker.py --backend URL --name NAME --process ID --history FILE
              [--workload lock-set|lock] [--unfenced] [--gate URL] [--ttl-ms N] [--wait-ms N]
              [--hold-ms N] [--write-hold-ms N] [--duration-ms N] [--ops N] [--seed N]
              [--clock-step-at-ms N --clock-step-ms N]

The flags, the workload and the history format are the harness's (tests/histories/README.md);
the Go and C++ workers take the same ones. Exits 3 for a backend or gate it cannot open.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from typing import Any

from leasehold import LockClient, LockTimeout, StaleFencingToken
from leasehold.cli import UsageError, open_backend
from leasehold.fencing import FencingGate

UNSUPPORTED = 3
TABLE = "lh_hist_set"


class History:
    """Appends one JSON line per event, each with a single write()."""

    def __init__(self, path: str, process: str, name: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.p, self.name = process, name
        self.lock = threading.Lock()

    def add(self, type_: str, f: str, **fields: Any) -> None:
        ev = {"p": self.p, "t": time.monotonic_ns(), "type": type_, "f": f, "name": self.name}
        for k in ("token", "valid_until", "value", "read", "error"):
            ev[k] = fields.pop(k, None)
        ev.update(fields)
        with self.lock:
            ev["t"] = time.monotonic_ns()
            os.write(self.fd, (json.dumps(ev) + "\n").encode())


class Store:
    """The resource: a set per name, written through the fencing gate (or not, --unfenced)."""

    def __init__(self, url: str, fenced: bool, write_hold: float) -> None:
        self.url, self.fenced, self.write_hold = url, fenced, write_hold
        if url.startswith("sqlite://"):
            self.kind = "sqlite"
            self.path = url[len("sqlite://") :]
        elif url.startswith(("postgresql://", "postgres://")):
            self.kind = "postgres"
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise SystemExit(UNSUPPORTED) from None
        else:
            print(f"worker.py: unsupported gate {url!r}", file=sys.stderr)
            raise SystemExit(UNSUPPORTED)
        self.conn: Any = None
        self.gate: FencingGate | None = None

    def _open(self) -> None:
        if self.kind == "sqlite":
            self.conn = sqlite3.connect(self.path, timeout=10)
            self.conn.execute("PRAGMA busy_timeout = 10000")
            self.gate = FencingGate(self.conn)
        else:
            import psycopg

            self.conn = psycopg.connect(self.url, connect_timeout=5)
            self.gate = FencingGate(self.conn, dialect="postgres")
        self.gate.ensure_schema()
        cur = self.conn.cursor()
        cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (resource TEXT NOT NULL, value BIGINT NOT NULL)")
        cur.close()
        self.conn.commit()

    def _ph(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"

    def _rmw(self, cur: Any, name: str, value: int) -> int:
        cur.execute(f"SELECT count(*) FROM {TABLE} WHERE resource = {self._ph()}", (name,))
        (n,) = cur.fetchone()
        if self.write_hold:
            time.sleep(self.write_hold)
        cur.execute(f"INSERT INTO {TABLE} (resource, value) VALUES ({self._ph()}, {self._ph()})", (name, value))
        return int(n)

    def write(self, name: str, token: int, value: int) -> int:
        """Read the set and add ``value`` in one transaction; returns the count read."""
        if self.conn is None:
            self._open()
        try:
            if self.fenced:
                assert self.gate is not None
                with self.gate.guard(name, token) as cur:
                    return self._rmw(cur, name, value)
            if self.kind == "sqlite":
                self.conn.execute("BEGIN")  # deferred: the read does not lock out other writers
            cur = self.conn.cursor()
            try:
                n = self._rmw(cur, name, value)
                self.conn.commit()
                return n
            except BaseException:
                self.conn.rollback()
                raise
        except StaleFencingToken:
            raise
        except Exception:
            self.reset()
            raise

    def reset(self) -> None:
        try:
            if self.conn is not None:
                self.conn.close()
        except Exception:
            pass
        self.conn = self.gate = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--process", required=True)
    ap.add_argument("--history", required=True)
    ap.add_argument("--workload", default="lock-set", choices=["lock-set", "lock"])
    ap.add_argument("--unfenced", action="store_true")
    ap.add_argument("--gate")
    ap.add_argument("--ttl-ms", type=int, default=1000)
    ap.add_argument("--wait-ms", type=int, default=2000)
    ap.add_argument("--hold-ms", type=int, default=50)
    ap.add_argument("--write-hold-ms", type=int, default=0)
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--ops", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock-step-at-ms", type=int)
    ap.add_argument("--clock-step-ms", type=int, default=0)
    args = ap.parse_args()

    index = int(args.process.rsplit("-", 1)[-1]) if args.process.rsplit("-", 1)[-1].isdigit() else 0
    rng = random.Random(args.seed)
    hist = History(args.history, args.process, args.name)
    store = None
    if args.workload == "lock-set":
        if not args.gate:
            print("worker.py: lock-set needs --gate", file=sys.stderr)
            return 2
        store = Store(args.gate, not args.unfenced, args.write_hold_ms / 1000)
    try:
        service = open_backend(args.backend)
    except UsageError as e:
        print(f"worker.py: unsupported backend: {e}", file=sys.stderr)
        return UNSUPPORTED

    offset = [0]  # the injected clock's step (ns): the lease clock runs ahead of the host's by it
    clock = (lambda: time.monotonic_ns() + offset[0]) if args.clock_step_at_ms is not None else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def host_ns(vu: int | None) -> int | None:
        return None if vu is None else vu - offset[0]

    def on_lost(h: Any) -> None:
        hist.add("info", "lost", token=h.fencing_token, error=str(h.lost_reason))

    hist.add("info", "start", pid=os.getpid(), language="python")
    started = time.monotonic()
    if args.clock_step_at_ms is not None:

        def step() -> None:
            if stop.wait(args.clock_step_at_ms / 1000):
                return
            offset[0] += args.clock_step_ms * 1_000_000
            hist.add("info", "clock-step", error=f"{args.clock_step_ms} ms")

        threading.Thread(target=step, daemon=True).start()
    client = LockClient(service, clock=clock)
    counter = 0
    done = 0
    try:
        while not stop.is_set():
            if args.ops and done >= args.ops:
                break
            if args.duration_ms and (time.monotonic() - started) * 1000 >= args.duration_ms:
                break
            done += 1
            hist.add("invoke", "acquire")
            try:
                h = client.acquire(args.name, args.ttl_ms / 1000, wait=args.wait_ms / 1000, on_lost=on_lost)
            except LockTimeout as e:
                hist.add("fail", "acquire", error=type(e).__name__)
                continue
            except Exception as e:
                hist.add("info", "acquire", error=f"{type(e).__name__}: {e}")
                time.sleep(0.05)
                continue
            token = h.fencing_token
            hist.add("ok", "acquire", token=token, valid_until=host_ns(h.valid_until_ns))
            time.sleep(rng.uniform(0, args.hold_ms / 1000))
            if store is not None:
                counter += 1
                value = index * 1_000_000_000 + counter
                hist.add("invoke", "write", token=token, value=value, valid_until=host_ns(h.valid_until_ns))
                try:
                    n = store.write(args.name, token, value)
                    hist.add("ok", "write", token=token, value=value, read=n)
                except StaleFencingToken:
                    hist.add("fail", "write", token=token, value=value, error="stale")
                except Exception as e:
                    hist.add("info", "write", token=token, value=value, error=f"{type(e).__name__}: {e}")
                time.sleep(rng.uniform(0, args.hold_ms / 1000))
            hist.add("invoke", "release", token=token, valid_until=host_ns(h.valid_until_ns))
            try:
                outcome = str(h.release())
            except Exception as e:
                hist.add("info", "release", token=token, error=f"{type(e).__name__}: {e}")
                continue
            if outcome == "released":
                hist.add("ok", "release", token=token)
            else:
                hist.add("fail", "release", token=token, error=outcome)
    finally:
        client.close()
        hist.add("info", "stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())

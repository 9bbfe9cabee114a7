"""leasehold on Redis vs redis-py's Lock vs python-redis-lock, on one real redis-server.

Run (from bindings/python, after `cargo build --release` and ./setup-venv.sh)::

    .venv/bin/python bench/bench_redis.py            # full run (~3 minutes)
    .venv/bin/python bench/bench_redis.py --quick    # smoke run (~40 s, fewer samples)
    .venv/bin/python bench/bench_redis.py --json out.json

It starts its own redis-server on a free loopback port (no persistence) and measures, for each
library, in one run:

1. uncontended acquire+release cycles per second (one thread, one name), beside the floor: the
   requests leasehold's core sends for one cycle, recorded from a real client and replayed
   pre-encoded on a plain socket (no library), and a bare ``SET NX PX`` / ``DEL`` loop;
2. handoff latency (the releasing thread's ``release()`` call → the next holder's
   ``acquire()`` returning) p50/p99 with 8 and with 32 waiters (threads; each holder keeps the
   lock 10 ms so that the others are settled waiters when it releases, and only queues again
   once somebody else got the lock, so every handoff goes to another waiter);
   leasehold twice: one LockClient per waiter and one shared client; then leasehold,
   python-redis-lock and the handoff floor (``handoff_floor.py``: the protocol's release
   script, wake-up message and acquire script on plain sockets) once more with every waiter
   in its own OS process;
3. Redis commands per second caused by 8 idle waiters while the lock is held (INFO
   commandstats delta over a window; the benchmark's own INFO calls and the holder's renewals
   are subtracted);
4. takeover time after the holder process is SIGKILLed at an arbitrary moment while it keeps
   renewing (leasehold automatically, python-redis-lock with auto_renewal, redis-py with a
   reacquire() loop): from the moment its TTL runs out in Redis (PTTL read right after the
   kill) to the waiter's ``acquire()`` returning;
5. the uncontended cycles of 1. on an event loop: ``AsyncLockClient``, ``redis.asyncio``'s
   ``Lock`` and the floor on an asyncio stream;
6. only with ``--only gap``: one ``acquire()`` and one ``release()`` of leasehold after an idle
   gap (none, 1, 10, 60 ms), beside the floor's same script call after the same gap.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
PKG = HERE.parent
sys.path.insert(0, str(PKG))
sys.path.insert(0, str(PKG / "tests" / "redis"))
sys.path.insert(0, str(HERE))

import redis  # noqa: E402
import redis_lock  # noqa: E402
from handoff_floor import FloorHandoffLocker, recorded_scripts  # noqa: E402
from lh_redis_server import RedisServer, ensure_redis_server  # noqa: E402

from leasehold import LockClient  # noqa: E402
from leasehold.backends.redis import RedisLockService  # noqa: E402

clock = time.perf_counter
FLOOR = "floor (core's requests, raw socket)"


# ---- adapters: one "locker" per waiter ---------------------------------------------------------
def lh_client(url: str) -> LockClient:
    """leasehold's LockClient on ``RedisLockService.from_url`` (the byte path: the core owns the
    wire, the executor moves bytes; 2 s request and connect timeouts)."""
    return LockClient(RedisLockService.from_url(url))


def lh_redis_py_client(url: str) -> LockClient:
    """leasehold's LockClient on ``RedisLockService(redis-py client)`` (the core speaks the
    protocol, redis-py runs its requests; 2 s socket and connect timeouts)."""
    own = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0, socket_keepalive=True)
    return LockClient(RedisLockService(own, owns_client=True))


class Locker:
    def acquire(self, name: str, ttl: float, wait: float) -> Any: ...
    def release(self, h: Any) -> None: ...
    def close(self) -> None: ...


class LeaseholdLocker(Locker):
    def __init__(self, url: str, client: LockClient | None = None, own: bool | None = None) -> None:
        self.own = client is None if own is None else own
        self.client = client or lh_client(url)

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        return self.client.acquire(name, ttl=ttl, wait=wait)

    def release(self, h: Any) -> None:
        h.release()

    def close(self) -> None:
        if self.own:
            self.client.close()


class RedisPyLocker(Locker):
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        lock = self.r.lock(name, timeout=ttl, sleep=0.1, blocking_timeout=wait)
        if not lock.acquire(blocking=wait > 0):
            raise TimeoutError(name)
        return lock

    def release(self, h: Any) -> None:
        h.release()


class PRLLocker(Locker):
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        lock = redis_lock.Lock(self.r, name, expire=max(1, int(ttl)))
        if not lock.acquire(blocking=wait > 0):
            raise TimeoutError(name)
        return lock

    def release(self, h: Any) -> None:
        h.release()


class _Recorder(RedisLockService):
    """Records the commands the core asks for (the documented ``command`` extension point)."""

    def __init__(self, url: str) -> None:
        super().__init__(redis.Redis.from_url(url))
        self.seen: list[list[bytes]] = []

    def command(self, argv: list[bytes]) -> Any:
        self.seen.append(list(argv))
        return super().command(argv)


def _resp(argv: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in argv)


def _reply_end(buf: bytes, i: int = 0) -> int | None:
    """Where the RESP reply that starts at ``buf[i]`` ends (None while it is incomplete): all
    the floor parses, to know a reply is whole."""
    nl = buf.find(b"\r\n", i)
    if nl < 0:
        return None
    kind, n = buf[i : i + 1], int(buf[i + 1 : nl] or b"0") if buf[i : i + 1] in b"*$" else 0
    if kind == b"$":
        end = nl + 2 + n + 2 if n >= 0 else nl + 2  # $-1: nil, no body
        return end if len(buf) >= end else None
    if kind == b"*":
        j: int | None = nl + 2
        for _ in range(max(n, 0)):
            j = _reply_end(buf, j) if j is not None else None
        return j
    return nl + 2


class _RawConn:
    """A plain socket that reads whole RESP replies (what the floor needs: no parsing beyond
    finding a reply's end)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, payload: bytes) -> bytes:
        self.sock.sendall(payload)
        while True:
            end = _reply_end(self.buf)
            if end is not None:
                reply, self.buf = self.buf[:end], self.buf[end:]
                return reply
            self.buf += self.sock.recv(65536)

    def close(self) -> None:
        self.sock.close()


class FloorLocker(Locker):
    """The floor: the very requests leasehold's core sends for one uncontended acquire +
    release (recorded once from a real client, so the same scripts, keys and arguments),
    replayed pre-encoded on a plain socket with no library and no lock logic."""

    def __init__(self, url: str) -> None:
        rec = _Recorder(url)
        client = LockClient(rec)
        try:
            for _ in range(3):  # past the script loading: the steady state
                rec.seen.clear()
                client.acquire("tp-floor", ttl=10.0, wait=0.0).release()
        finally:
            client.close()
        self.requests = [_resp(argv) for argv in rec.seen]
        self.conn = _RawConn(url)

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        for payload in self.requests:
            self.conn.call(payload)

    def release(self, h: Any) -> None:
        pass

    def close(self) -> None:
        self.conn.close()


class SetNxLocker(Locker):
    """A bare ``SET key token NX PX`` / ``DEL`` loop on a plain socket: no fence, no check of
    the owner on release, no queue (what the simplest lock does; reported, no target)."""

    def __init__(self, url: str) -> None:
        self.conn = _RawConn(url)

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        reply = self.conn.call(_resp([b"SET", name.encode(), b"tok", b"NX", b"PX", b"%d" % int(ttl * 1000)]))
        if not reply.startswith(b"+OK"):
            raise TimeoutError(name)
        return name

    def release(self, h: Any) -> None:
        self.conn.call(_resp([b"DEL", h.encode()]))

    def close(self) -> None:
        self.conn.close()


class Impl:
    def __init__(self, label: str, make: Callable[[], Locker], holder_code: str) -> None:
        self.label = label
        self.make = make
        self.holder_code = holder_code


def impls(url: str, r: redis.Redis, shared_client: LockClient) -> list[Impl]:
    lh_holder = (
        "from leasehold import LockClient\n"
        "from leasehold.backends.redis import RedisLockService\n"
        "c = LockClient(RedisLockService.from_url(URL))\n"
        "h = c.acquire(NAME, ttl=TTL)\n"
    )
    # Holders keep renewing until they are killed, as real holders do (python-redis-lock with
    # auto_renewal, redis-py with a reacquire() loop), so the moment of death is arbitrary
    # relative to the waiters' own timers.
    rp_holder = (
        "import redis, time\nr = redis.Redis.from_url(URL)\nlock = r.lock(NAME, timeout=TTL)\n"
        "assert lock.acquire()\nprint('HELD', flush=True)\n"
        "while True:\n    time.sleep(TTL / 3)\n    lock.reacquire()\n"
    )
    prl_holder = (
        "import redis, redis_lock\nr = redis.Redis.from_url(URL)\n"
        "lock = redis_lock.Lock(r, NAME, expire=int(TTL), auto_renewal=True)\n"
        "assert lock.acquire()\n"  # keep `lock` referenced: its renewal thread stops when it is collected
    )
    return [
        Impl("leasehold", lambda: LeaseholdLocker(url), lh_holder),
        Impl("leasehold (redis-py)", lambda: LeaseholdLocker(url, lh_redis_py_client(url), True), lh_holder),
        Impl("leasehold (1 shared client)", lambda: LeaseholdLocker(url, shared_client), lh_holder),
        Impl("redis-py Lock", lambda: RedisPyLocker(r), rp_holder),
        Impl("python-redis-lock", lambda: PRLLocker(r), prl_holder),
    ]


# ---- 1. uncontended throughput ------------------------------------------------------------------
def server_cpu(r: redis.Redis) -> float:
    """redis-server's CPU time so far (seconds, main thread and children)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def bench_throughput(
    impls_: list[Impl], rounds: int, seconds: float, ref: str = "redis-py Lock", r: redis.Redis | None = None
) -> dict[str, Any]:
    """Interleaved rounds (A B C D A B C D ...) so that load from other processes on the machine
    hits every library alike; reports the median and the best round, this process's CPU time
    per cycle (all its threads; redis-server is another process), and the
    median of the per-round ratios to ``ref`` (round i of a library against round i of ``ref``,
    at most a few rounds apart: a load burst hits both sides of most pairs). With ``r``, also
    redis-server's CPU time per cycle (INFO cpu around each round)."""
    lockers = {impl.label: impl.make() for impl in impls_}
    rates: dict[str, list[float]] = {impl.label: [] for impl in impls_}
    cpu: dict[str, list[float]] = {impl.label: [] for impl in impls_}
    srv_cpu: dict[str, list[float]] = {impl.label: [] for impl in impls_}
    try:
        for label, locker in lockers.items():
            for _ in range(50):  # warm-up (script cache, connections, threads)
                locker.release(locker.acquire(f"tp-{label}", 10.0, 0.0))
        for _ in range(rounds):
            for label, locker in lockers.items():
                name = f"tp-{label}"
                n = 0
                s0 = server_cpu(r) if r is not None else 0.0
                start = clock()
                cpu0 = time.process_time()
                end = start + seconds
                while clock() < end:
                    for _ in range(10):
                        locker.release(locker.acquire(name, 10.0, 0.0))
                    n += 10
                cpu[label].append((time.process_time() - cpu0) / n * 1e6)
                rates[label].append(n / (clock() - start))
                if r is not None:
                    srv_cpu[label].append((server_cpu(r) - s0) / n * 1e6)
    finally:
        for locker in lockers.values():
            locker.close()
    base, floor = rates.get(ref), rates.get(FLOOR)
    return {
        label: {
            "median_ops_per_s": statistics.median(v),
            "best_ops_per_s": max(v),
            "paired_ratio_vs_ref": statistics.median(a / b for a, b in zip(v, base)) if base else None,
            "paired_ratio_vs_floor": statistics.median(a / b for a, b in zip(v, floor)) if floor else None,
            "cpu_us_per_cycle_median": statistics.median(cpu[label]),
            "server_cpu_us_per_cycle_median": statistics.median(srv_cpu[label]) if srv_cpu[label] else None,
            "rounds": [round(x) for x in v],
        }
        for label, v in rates.items()
    }


# ---- 2. handoff latency ---------------------------------------------------------------------------
def bench_handoff(impl: Impl, waiters: int, handoffs: int, timeout: float, hold: float = 0.01) -> dict[str, Any]:
    name = f"ho-{waiters}-{impl.label}"
    lockers = [impl.make() for _ in range(waiters + 1)]
    cond = threading.Condition()
    state: dict[str, Any] = {"released_at": None, "gen": 0, "holder": None, "stop": False}
    lat: list[float] = []
    errors: list[BaseException] = []

    def run(i: int, locker: Locker) -> None:
        try:
            while True:
                with cond:
                    if state["stop"]:
                        return
                try:
                    h = locker.acquire(name, 10.0, 60.0)
                except TimeoutError:
                    continue
                t = clock()
                with cond:
                    if state["released_at"] is not None and not state["stop"]:
                        lat.append(t - state["released_at"])
                        if len(lat) >= handoffs:
                            state["stop"] = True
                    state["gen"] += 1
                    state["holder"] = i
                    gen = state["gen"]
                    cond.notify_all()
                    # Hold a moment (the first holder: long enough for everybody to queue up), so
                    # that at release time every other thread is settled in its waiting state
                    # (blocked / subscribed / sleeping) rather than racing a first attempt.
                    cond.wait(1.5 if state["released_at"] is None else hold)
                    state["released_at"] = clock()
                locker.release(h)
                with cond:
                    # only queue again once somebody else holds it (each handoff goes elsewhere)
                    end = clock() + timeout
                    while state["gen"] == gen and not state["stop"] and clock() < end:
                        cond.wait(0.5)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            with cond:
                state["stop"] = True
                cond.notify_all()

    threads = [threading.Thread(target=run, args=(i, lk), daemon=True) for i, lk in enumerate(lockers)]
    t0 = clock()
    for t in threads:
        t.start()
    end = t0 + timeout
    with cond:
        while not state["stop"] and clock() < end:
            cond.wait(0.5)
        state["stop"] = True
        cond.notify_all()
    # the last holder releases; waiters still blocked get the lock once each and exit
    for t in threads:
        t.join(max(0.1, end + 90 - clock()))
    for lk in lockers:
        lk.close()
    if errors:
        raise errors[0]
    lat.sort()
    return summarize(lat)


# Handoff across processes: one waiter per OS process, as separate services would run. The
# thread version above keeps every client in one interpreter, so a release that wakes all
# clients also queues them all on one GIL; here each client has its own.
HANDOFF_FLOOR = "floor (protocol steps, raw sockets)"


def _make_locker(kind: str, url: str, scripts: Any = None) -> Locker:
    if kind == "leasehold":
        return LeaseholdLocker(url)
    if kind == "leasehold (redis-py)":
        return LeaseholdLocker(url, lh_redis_py_client(url), True)
    if kind == HANDOFF_FLOOR:
        return FloorHandoffLocker(url, *scripts)  # type: ignore[return-value]
    if kind == "python-redis-lock":
        return PRLLocker(redis.Redis.from_url(url))
    if kind == "redis-py Lock":
        return RedisPyLocker(redis.Redis.from_url(url))
    raise ValueError(kind)


def _handoff_process(kind: str, url: str, name: str, hold: float, sh: dict[str, Any], scripts: Any) -> None:
    locker = _make_locker(kind, url, scripts)
    sh["ready"].wait()
    try:
        while not sh["stop"].value:
            try:
                h = locker.acquire(name, 10.0, 60.0)
            except TimeoutError:
                continue
            t = clock()  # CLOCK_MONOTONIC: comparable across processes on one host
            with sh["mu"]:
                first = sh["released_at"].value < 0
                if not first and not sh["stop"].value:
                    n = sh["count"].value
                    if n < len(sh["lat"]):
                        sh["lat"][n] = t - sh["released_at"].value
                        sh["count"].value = n + 1
                    if n + 1 >= len(sh["lat"]):
                        sh["stop"].value = 1
                sh["gen"].value += 1
                gen = sh["gen"].value
            if not sh["stop"].value:
                # The first holder waits until every other process is parked in acquire().
                time.sleep(2.0 if first else hold)
            with sh["mu"]:
                sh["released_at"].value = clock()
            locker.release(h)
            # Queue again only once somebody else holds it (each handoff goes elsewhere).
            while sh["gen"].value == gen and not sh["stop"].value:
                time.sleep(0.0005)
    finally:
        locker.close()


def bench_handoff_processes(
    kind: str, url: str, waiters: int, handoffs: int, timeout: float, hold: float = 0.01
) -> dict[str, Any]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    sh = {
        "mu": ctx.Lock(),
        "ready": ctx.Barrier(waiters + 1),
        "released_at": ctx.Value("d", -1.0, lock=False),
        "gen": ctx.Value("q", 0, lock=False),
        "count": ctx.Value("i", 0, lock=False),
        "stop": ctx.Value("b", 0, lock=False),
        "lat": ctx.Array("d", handoffs, lock=False),
    }
    name = f"hp-{waiters}-{kind}"
    scripts = None
    if kind == HANDOFF_FLOOR:  # the scripts and keys the core sends for this name
        rec = _Recorder(url)
        client = LockClient(rec)
        try:
            client.acquire(name, ttl=10.0, wait=1.0).release()
        finally:
            client.close()
        scripts = recorded_scripts(rec.seen)
    procs = [
        ctx.Process(target=_handoff_process, args=(kind, url, name, hold, sh, scripts), daemon=True)
        for _ in range(waiters + 1)
    ]
    for p in procs:
        p.start()
    end = clock() + timeout
    while clock() < end and not sh["stop"].value and all(p.is_alive() for p in procs):
        time.sleep(0.1)
    sh["stop"].value = 1
    # Waiters still blocked get the lock once each (the stop flag sends them home).
    for p in procs:
        p.join(max(0.1, end + 90 - clock()))
    for p in procs:
        if p.is_alive():
            p.kill()
    lat = sorted(sh["lat"][: sh["count"].value])
    return summarize(lat)


def summarize(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)

    def pct(p: float) -> float:
        return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] * 1000

    return {"n": len(xs), "p50_ms": pct(50), "p99_ms": pct(99), "max_ms": xs[-1] * 1000, "mean_ms": statistics.mean(xs) * 1000}


# ---- 3. idle waiters' load on Redis ------------------------------------------------------------------
def total_calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


LUA_INTERNAL = {
    "type", "hmget", "hget", "pttl", "pexpire", "time", "hset", "publish", "get", "set", "del",
    "exists", "zpopmin", "zrange", "zrank", "zadd", "zremrangebyscore", "zscore", "zcard", "mget",
    "setrange",
}


def bench_idle(
    impl: Impl, r: redis.Redis, url: str, waiters: int, window: float, warmup: float, ttl: float = 60.0
) -> dict[str, Any]:
    """The holder's TTL (60 s) outlasts warm-up + window, so nobody's lock expires meanwhile
    (redis-py's and python-redis-lock's holders do not renew)."""
    name = f"idle-{impl.label}"
    # the holder is always its own client, so that its renewals can be told apart
    holder = LeaseholdLocker(url) if "shared" in impl.label else impl.make()
    h = holder.acquire(name, ttl, 0.0)
    lockers = [impl.make() for _ in range(waiters)]
    got: list[Any] = []

    def wait_one(lk: Locker) -> None:
        try:
            hh = lk.acquire(name, ttl, 120.0)
            lk.release(hh)
            got.append(1)
        except Exception as e:  # noqa: BLE001
            got.append(e)

    threads = [threading.Thread(target=wait_one, args=(lk,), daemon=True) for lk in lockers]
    for t in threads:
        t.start()
    time.sleep(warmup)
    renew_before = holder.client.counters().renewals_sent if isinstance(holder, LeaseholdLocker) else 0
    a = total_calls(r)
    time.sleep(window)
    b = total_calls(r)
    renew_after = holder.client.counters().renewals_sent if isinstance(holder, LeaseholdLocker) else 0
    delta = {k: b.get(k, 0) - a.get(k, 0) for k in b}
    delta["info"] = delta.get("info", 0) - 1  # the second INFO call itself
    delta = {k: v for k, v in delta.items() if v > 0}
    renewals = renew_after - renew_before
    # commandstats also counts the commands a Lua script runs inside Redis; only leasehold runs
    # scripts in this phase (its waiters' retries and the holder's renewals), so for it count the
    # client's requests (script calls, PING, ...) and report the script-internal ones separately.
    internal = LUA_INTERNAL if impl.label.startswith("leasehold") else set()
    inside = sum(v for k, v in delta.items() if k in internal)
    waiter_cmds = sum(delta.values()) - delta.get("info", 0) - renewals - inside
    try:
        holder.release(h)
    except Exception as e:  # noqa: BLE001 - e.g. redis-py's LockNotOwnedError if the TTL ran out
        print(f"(idle holder release: {type(e).__name__}: {e})", flush=True)
    for t in threads:
        t.join(60)
    for lk in lockers:
        lk.close()
    holder.close()
    return {
        "cmds_per_s_total": waiter_cmds / window,
        "cmds_per_s_per_waiter": waiter_cmds / window / waiters,
        "breakdown": delta,
        "holder_renewals_subtracted": renewals,
        "commands_inside_scripts_not_counted": inside,
        "waiters_completed": sum(1 for g in got if g == 1),
    }


# ---- 4. takeover after SIGKILL -------------------------------------------------------------------------
def bench_takeover(impl: Impl, r: redis.Redis, url: str, runs: int, ttl: float) -> dict[str, Any]:
    import random

    rnd = random.Random(1234)
    out: list[float] = []
    for i in range(runs):
        name = f"tk-{impl.label}-{i}".replace(" ", "_")
        code = impl.holder_code.replace("URL", repr(url)).replace("NAME", repr(name)).replace("TTL", repr(ttl))
        if "print('HELD'" not in code:
            code += "print('HELD', flush=True)\nimport time\ntime.sleep(3600)\n"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PKG), os.environ.get("PYTHONPATH", "")]))
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        try:
            line = p.stdout.readline() if p.stdout else ""
            if not line.startswith("HELD"):
                raise RuntimeError(f"holder did not start: {line!r}")
            locker = impl.make()
            res: dict[str, Any] = {}

            def waiter() -> None:
                try:
                    h = locker.acquire(name, ttl, 60.0)
                    res["t"] = clock()
                    locker.release(h)
                except BaseException as e:  # noqa: BLE001
                    res["e"] = e

            t = threading.Thread(target=waiter, daemon=True)
            t.start()
            # Kill the holder at an arbitrary moment (after the waiter is blocked/subscribed/
            # sleeping): the waiters' retry timers have no fixed phase relative to the death.
            time.sleep(0.5 + rnd.random() * ttl)
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            key = _lock_key(impl, name)
            pttl = r.pttl(key)
            t_exp = clock() + max(pttl, 0) / 1000.0
            t.join(90)
            locker.close()
            if "e" in res:
                raise res["e"]
            out.append(res["t"] - t_exp)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"runs_ms": [round(x * 1000, 1) for x in out], "median_ms": statistics.median(out) * 1000}


# ---- 5. uncontended acquire + release on an event loop -------------------------------------------
def bench_asyncio(url: str, rounds: int, seconds: float) -> dict[str, Any]:
    """The throughput rows on one event loop: leasehold's ``AsyncLockClient`` on
    ``RedisLockService.from_url`` (the byte path on the loop), redis-py's ``redis.asyncio``
    ``Lock``, and the floor: the core's requests for one cycle (recorded as for the threaded
    floor) on an asyncio stream, each reply read whole. Interleaved rounds and paired ratios,
    as in :func:`bench_throughput`."""
    import asyncio

    import redis.asyncio as aredis

    from leasehold import AsyncLockClient

    requests = FloorLocker(url)
    payloads = requests.requests
    requests.close()
    host, port = url.removeprefix("redis://").split("/")[0].rsplit(":", 1)

    async def main() -> dict[str, Any]:
        lh = AsyncLockClient(RedisLockService.from_url(url))
        ar = aredis.Redis.from_url(url)
        reader, writer = await asyncio.open_connection(host, int(port))
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        async def floor_cycle(name: str) -> None:
            for payload in payloads:
                writer.write(payload)
                buf = b""
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        raise ConnectionError("redis-server closed the floor's connection")
                    buf += chunk
                    if _reply_end(buf) is not None:
                        break

        async def lh_cycle(name: str) -> None:
            h = await lh.acquire(name, ttl=10.0)
            await h.release()

        async def ar_cycle(name: str) -> None:
            lock = ar.lock(name, timeout=10.0)
            if not await lock.acquire(blocking=False):
                raise TimeoutError(name)
            await lock.release()

        cycles = {"leasehold (AsyncLockClient)": lh_cycle, "redis.asyncio Lock": ar_cycle, FLOOR: floor_cycle}
        rates: dict[str, list[float]] = {k: [] for k in cycles}
        cpu: dict[str, list[float]] = {k: [] for k in cycles}
        try:
            for label, cycle in cycles.items():
                for _ in range(50):
                    await cycle(f"aio-{label}")
            for _ in range(rounds):
                for label, cycle in cycles.items():
                    n, start, cpu0 = 0, clock(), time.process_time()
                    while clock() < start + seconds:
                        for _ in range(10):
                            await cycle(f"aio-{label}")
                        n += 10
                    cpu[label].append((time.process_time() - cpu0) / n * 1e6)
                    rates[label].append(n / (clock() - start))
        finally:
            await lh.close()
            await ar.aclose()
            writer.close()
        ref, floor = rates["redis.asyncio Lock"], rates[FLOOR]
        return {
            label: {
                "median_ops_per_s": statistics.median(v),
                "paired_ratio_vs_redis_asyncio_lock": statistics.median(a / b for a, b in zip(v, ref)),
                "paired_ratio_vs_floor": statistics.median(a / b for a, b in zip(v, floor)),
                "cpu_us_per_cycle_median": statistics.median(cpu[label]),
                "rounds": [round(x) for x in v],
            }
            for label, v in rates.items()
        }

    return asyncio.run(main())


# ---- 6. one call after an idle gap ------------------------------------------------------------------
def bench_gap(url: str, gaps: tuple[float, ...], samples: int) -> dict[str, Any]:
    """How long one acquire() and one release() take on a thread that was idle for ``gap``
    seconds before each, beside the floor's same request (the recorded script call on a plain
    socket) after the same gap. A handoff is made of such calls: the holder's release and the
    waiter's reaction come after the holding time, so they run on cold caches.
    Samples of the two alternate, so a change of the machine's state weighs on both."""
    lk = LeaseholdLocker(url)
    floor = FloorLocker(url)
    acquire_req, release_req = floor.requests[0], floor.requests[-1]
    out: dict[str, Any] = {}
    try:
        for _ in range(20):  # past the connection and the script loading
            lk.release(lk.acquire("gap", 10.0, 0.0))
        for gap in gaps:
            t: dict[str, list[float]] = {"acquire": [], "release": [], "floor acquire": [], "floor release": []}
            for _ in range(samples):
                if gap:
                    time.sleep(gap)
                t0 = clock()
                h = lk.acquire("gap", 10.0, 0.0)
                t["acquire"].append(clock() - t0)
                if gap:
                    time.sleep(gap)
                t0 = clock()
                lk.release(h)
                t["release"].append(clock() - t0)
                for key, payload in (("floor acquire", acquire_req), ("floor release", release_req)):
                    if gap:
                        time.sleep(gap)
                    t0 = clock()
                    floor.conn.call(payload)
                    t[key].append(clock() - t0)
            p50 = {k: statistics.median(v) * 1e6 for k, v in t.items()}
            out[f"{gap * 1000:g} ms"] = {
                "p50_us": p50,
                "acquire_vs_floor": p50["acquire"] / p50["floor acquire"],
                "release_vs_floor": p50["release"] / p50["floor release"],
            }
    finally:
        lk.close()
        floor.close()
    return out


def _lock_key(impl: Impl, name: str) -> str:
    if impl.label.startswith("leasehold"):
        from lh_keys import keys_for

        return keys_for(name).lock
    if impl.label.startswith("python-redis-lock"):
        return f"lock:{name}"
    return name


# ---- main ----------------------------------------------------------------------------------------------
def report_handoff(results: dict[str, Any], label: str, waiters: int, res: dict[str, Any]) -> None:
    results["handoff"][f"{label} / {waiters} waiters"] = res
    print(
        f"handoff     {label:30s} {waiters:2d} waiters  p50 {res.get('p50_ms', 0):7.2f} ms"
        f"  p99 {res.get('p99_ms', 0):7.2f} ms  (n={res['n']})",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--only", help="comma-separated subset: throughput,handoff,idle,takeover,asyncio,gap (gap: not in the default set)")
    ap.add_argument("--tp-rounds", type=int, help="interleaved throughput rounds (default 7, quick 3)")
    ap.add_argument("--tp-seconds", type=float, default=0.7, help="length of one throughput round (default 0.7 s)")
    args = ap.parse_args()
    q = args.quick
    parts = set((args.only or "throughput,asyncio,handoff,idle,takeover").split(","))
    binary = ensure_redis_server()
    if binary is None:
        sys.exit("redis-server not found (apt-get install redis-server)")
    results: dict[str, Any] = {"python": sys.version.split()[0], "redis_py": redis.__version__}
    with RedisServer(binary) as srv:
        r = srv.client()
        results["redis_server"] = r.info("server")["redis_version"]
        shared = lh_client(srv.url)
        # The peers get a client with redis-py's defaults (no socket timeout: python-redis-lock
        # blocks in BLPOP for up to its expire time, longer than any socket timeout we would set).
        r_peers = redis.Redis.from_url(srv.url)
        all_impls = impls(srv.url, r_peers, shared)
        try:
            if "throughput" in parts:
                tp_impls = [i for i in all_impls if "shared" not in i.label] + [
                    Impl(FLOOR, lambda: FloorLocker(srv.url), ""),
                    Impl("raw SET NX PX / DEL", lambda: SetNxLocker(srv.url), ""),
                ]
                results["throughput"] = tp = bench_throughput(
                    tp_impls, rounds=args.tp_rounds or (3 if q else 7), seconds=args.tp_seconds, r=r
                )
                for label, res in tp.items():
                    print(
                        f"throughput  {label:30s} median {res['median_ops_per_s']:6.0f}  best {res['best_ops_per_s']:6.0f}"
                        f" acquire+release/s  paired ratio vs redis-py Lock {res['paired_ratio_vs_ref']:.2f}"
                        f", vs the floor {res['paired_ratio_vs_floor']:.2f}"
                        f"  cpu {res['cpu_us_per_cycle_median']:5.0f} us/cycle"
                        f" (redis-server {res['server_cpu_us_per_cycle_median']:4.0f})",
                        flush=True,
                    )
            if "asyncio" in parts:
                results["asyncio"] = aio = bench_asyncio(srv.url, rounds=args.tp_rounds or (3 if q else 7), seconds=args.tp_seconds)
                for label, res in aio.items():
                    print(
                        f"asyncio     {label:30s} median {res['median_ops_per_s']:6.0f} acquire+release/s"
                        f"  paired ratio vs redis.asyncio Lock {res['paired_ratio_vs_redis_asyncio_lock']:.2f}"
                        f", vs the floor {res['paired_ratio_vs_floor']:.2f}  cpu {res['cpu_us_per_cycle_median']:5.0f} us/cycle",
                        flush=True,
                    )
            if "handoff" in parts:
                results["handoff"] = {}
                ho_impls = list(all_impls)
                for waiters in (8, 32):
                    for impl in ho_impls:
                        n = (30 if q else 150) if "redis-py" not in impl.label else (20 if q else 80)
                        r.flushall()
                        res = bench_handoff(impl, waiters, n, timeout=120.0)
                        report_handoff(results, impl.label, waiters, res)
                    for kind in ("leasehold", "leasehold (redis-py)", HANDOFF_FLOOR, "python-redis-lock"):
                        r.flushall()
                        res = bench_handoff_processes(kind, srv.url, waiters, 30 if q else 150, timeout=120.0)
                        report_handoff(results, f"{kind} (process per waiter)", waiters, res)
            if "idle" in parts:
                results["idle"] = {}
                for impl in all_impls:
                    r.flushall()
                    res = bench_idle(impl, r, srv.url, 8, window=4.0 if q else 45.0, warmup=1.5)
                    results["idle"][impl.label] = res
                    print(
                        f"idle        {impl.label:30s} 8 waiters  {res['cmds_per_s_total']:7.2f} cmd/s"
                        f"  ({res['cmds_per_s_per_waiter']:.3f} per waiter)  {res['breakdown']}",
                        flush=True,
                    )
            if "gap" in parts:
                results["gap"] = gp = bench_gap(srv.url, (0.0, 0.001, 0.01, 0.06), 15 if q else 60)
                for gap, res in gp.items():
                    us = res["p50_us"]
                    print(
                        f"gap         {gap:>6s}  acquire {us['acquire']:6.0f} us (floor {us['floor acquire']:5.0f},"
                        f" {res['acquire_vs_floor']:.2f}x)  release {us['release']:6.0f} us"
                        f" (floor {us['floor release']:5.0f}, {res['release_vs_floor']:.2f}x)",
                        flush=True,
                    )
            if "takeover" in parts:
                results["takeover"] = {}
                for impl in all_impls:
                    if "shared" in impl.label:
                        continue
                    r.flushall()
                    res = bench_takeover(impl, r, srv.url, runs=2 if q else 5, ttl=2.0)
                    results["takeover"][impl.label] = res
                    print(f"takeover    {impl.label:30s} median {res['median_ms']:8.1f} ms  runs {res['runs_ms']}", flush=True)
        finally:
            shared.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

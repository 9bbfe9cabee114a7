"""Checkers over a merged history of lock clients (see README.md for what each check means).

    check.py HISTORY.jsonl [--final FINAL.json] [--no-exclusion] [--ttl-ms N] [--bound-ms N]

A history is JSON lines, one event each (tests/histories/README.md, "History format"): workers'
invoke/ok/fail/info lines and the orchestrator's "nemesis" lines. ``check()`` takes the events of
every process, merges them by ``t`` and returns the violations found; the CLI prints them and
exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

NEMESIS = "nemesis"
# A loss report may trail the end of validity by this much (the core decides just before
# valid_until; the callback thread and the history write follow).
DEFAULT_SLACK_MS = 500
# Liveness: after the last fault heals, some acquire succeeds within TTL + this bound (one
# request timeout of the core plus its backoff cap and a failover's settling).
DEFAULT_BOUND_MS = 3000
# A paused or killed holder's name goes to a waiter within its TTL + this much (a retry at the
# holder's expiry, the core's backoff cap of 500 ms, scheduling).
HANDOFF_BOUND_MS = 1500


class HistoryError(ValueError):
    """The history itself is malformed (not a verdict on the system under test)."""


@dataclass
class Op:
    """One operation: an invoke line and its completion (None if the process died first)."""

    p: str
    f: str
    name: str
    invoke_t: int
    inv: dict[str, Any]
    done: dict[str, Any] | None = None

    @property
    def type(self) -> str | None:
        return None if self.done is None else self.done["type"]

    @property
    def done_t(self) -> int | None:
        return None if self.done is None else self.done["t"]

    def get(self, key: str) -> Any:
        """A field from the completion if it has it, else from the invoke line."""
        if self.done is not None and self.done.get(key) is not None:
            return self.done[key]
        return self.inv.get(key)


@dataclass
class Grant:
    """A successful acquire and what its holder did with it."""

    op: Op
    token: int
    start: int  # the ok line's t: the holder knows it holds from here
    valid_until: int | None  # the latest validity its holder recorded
    release: Op | None = None
    signal_t: int | None = None  # when the holder was told it lost the lease
    signal: str | None = None
    end: int | None = None  # when the holder stopped believing it held it
    writes: list[Op] = field(default_factory=list)

    @property
    def p(self) -> str:
        return self.op.p

    @property
    def name(self) -> str:
        return self.op.name


@dataclass
class Violation:
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def parse(lines: Iterable[str]) -> list[dict[str, Any]]:
    """JSON lines to events; raises HistoryError on a line that is not a well-formed event."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise HistoryError(f"line {n}: not JSON ({e}): {line[:200]!r}") from None
        if not isinstance(ev, dict) or not isinstance(ev.get("p"), str) or not isinstance(ev.get("t"), int):
            raise HistoryError(f"line {n}: an event needs a string p and an integer t: {line[:200]!r}")
        if ev.get("type") not in ("invoke", "ok", "fail", "info"):
            raise HistoryError(f"line {n}: unknown type {ev.get('type')!r}")
        out.append(ev)
    return out


def merge(histories: Iterable[Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """All processes' events in one list ordered by t (stable: a process's own order is kept)."""
    events = [ev for h in histories for ev in h]
    return sorted(events, key=lambda ev: ev["t"])


@dataclass
class Model:
    ops: list[Op]
    grants: list[Grant]
    lost: list[dict[str, Any]]
    nemesis: list[dict[str, Any]]
    ends: dict[str, int]  # process -> when it stopped (stop line, or killed)
    killed: dict[str, int]
    last_t: int


def build(events: list[dict[str, Any]]) -> Model:
    """Pairs invokes with completions per process and links each grant to its holder's
    writes, release and loss report."""
    ops: list[Op] = []
    pending: dict[str, Op] = {}
    lost: list[dict[str, Any]] = []
    nemesis: list[dict[str, Any]] = []
    ends: dict[str, int] = {}
    killed: dict[str, int] = {}
    for ev in events:
        p, f = ev["p"], ev.get("f")
        if p == NEMESIS:
            nemesis.append(ev)
            if f == "kill" and isinstance(ev.get("process"), str):
                killed.setdefault(ev["process"], ev["t"])
                ends.setdefault(ev["process"], ev["t"])
            continue
        if ev["type"] == "info" and f in ("start", "stop", "lost", "clock-step"):
            if f == "lost":
                lost.append(ev)
            elif f == "stop":
                ends.setdefault(p, ev["t"])
            continue
        if f not in ("acquire", "write", "release"):
            raise HistoryError(f"{p} at t={ev['t']}: unknown f {f!r}")
        if ev["type"] == "invoke":
            if p in pending:
                raise HistoryError(f"{p} at t={ev['t']}: {f} invoked while its {pending[p].f} is open")
            op = Op(p, f, ev.get("name") or "", ev["t"], ev)
            pending[p] = op
            ops.append(op)
        else:
            op = pending.pop(p, None)  # type: ignore[assignment]
            if op is None or op.f != f:
                raise HistoryError(f"{p} at t={ev['t']}: {ev['type']} {f} without its invoke")
            op.done = ev
    last_t = events[-1]["t"] if events else 0

    grants: list[Grant] = []
    current: dict[str, Grant] = {}
    for op in ops:  # in invoke order, so each process's ops come in its own order
        if op.f == "acquire":
            current.pop(op.p, None)
            if op.type == "ok":
                tok = op.get("token")
                if not isinstance(tok, int):
                    raise HistoryError(f"{op.p}: acquire ok without a token")
                g = Grant(op, tok, op.done_t or op.invoke_t, op.get("valid_until"))
                grants.append(g)
                current[op.p] = g
            continue
        g = current.get(op.p)  # type: ignore[assignment]
        if g is None:
            continue
        vu = op.inv.get("valid_until")
        if isinstance(vu, int) and (g.valid_until is None or vu > g.valid_until):
            g.valid_until = vu
        if op.f == "write":
            g.writes.append(op)
        else:
            g.release = op
            if op.type in ("ok", "fail") and op.get("error") in ("lost", "not_owner"):
                g.signal_t, g.signal = op.done_t, f"release said {op.get('error')}"
            current.pop(op.p)
    by_token = {(g.p, g.token): g for g in grants}
    for ev in lost:
        g = by_token.get((ev["p"], ev.get("token")))  # type: ignore[arg-type]
        if g is not None and (g.signal_t is None or ev["t"] < g.signal_t):
            g.signal_t, g.signal = ev["t"], f"lost ({ev.get('error')})"
    for g in grants:
        candidates = [t for t in (g.release.invoke_t if g.release else None, g.signal_t, ends.get(g.p)) if t is not None]
        g.end = min(candidates) if candidates else last_t
    return Model(ops, grants, lost, nemesis, ends, killed, last_t)


def pauses_of(nemesis: list[dict[str, Any]], last_t: int) -> dict[str, list[tuple[int, int]]]:
    """Per process, the intervals it was stopped (SIGSTOP .. SIGCONT)."""
    out: dict[str, list[tuple[int, int]]] = {}
    open_: dict[str, int] = {}
    for ev in nemesis:
        target = ev.get("process")
        if ev.get("f") == "pause" and isinstance(target, str):
            open_[target] = ev["t"]
        elif ev.get("f") == "resume" and target in open_:
            out.setdefault(target, []).append((open_.pop(target), ev["t"]))
    for target, t in open_.items():
        out.setdefault(target, []).append((t, last_t))
    return out


def ms(ns: int) -> str:
    return f"{ns / 1e6:.1f}ms"


def check_fences(m: Model) -> list[Violation]:
    """Grants of one name in real-time order (one's ok before the other's invoke) carry strictly
    increasing tokens; no token is granted twice."""
    out: list[Violation] = []
    by_name: dict[str, list[Grant]] = {}
    for g in m.grants:
        by_name.setdefault(g.name, []).append(g)
    for name, gs in by_name.items():
        seen: dict[int, Grant] = {}
        for g in gs:
            if g.token in seen:
                other = seen[g.token]
                out.append(Violation("fences", f"{name}: token {g.token} granted to {other.p} and again to {g.p}"))
            seen[g.token] = g
        done = sorted(gs, key=lambda g: g.start)
        invoked = sorted(gs, key=lambda g: g.op.invoke_t)
        i, best = 0, None
        for g in invoked:
            while i < len(done) and done[i].start < g.op.invoke_t:
                if best is None or done[i].token > best.token:
                    best = done[i]
                i += 1
            if best is not None and g.token <= best.token and g is not best:
                out.append(
                    Violation(
                        "fences",
                        f"{name}: {g.p} was granted token {g.token} after {best.p}'s grant of {best.token} "
                        f"had completed ({ms(g.op.invoke_t - best.start)} earlier)",
                    )
                )
    return out


def check_exclusion(m: Model) -> list[Violation]:
    """Holders' windows [ok, min(release invoke, loss report, death)] of one name never overlap."""
    out: list[Violation] = []
    by_name: dict[str, list[Grant]] = {}
    for g in m.grants:
        by_name.setdefault(g.name, []).append(g)
    for name, gs in by_name.items():
        holder: Grant | None = None
        for g in sorted(gs, key=lambda g: g.start):
            if holder is not None and g.start < (holder.end or 0):
                out.append(
                    Violation(
                        "exclusion",
                        f"{name}: {g.p} (token {g.token}) acquired while {holder.p} (token {holder.token}) "
                        f"still held it ({ms((holder.end or 0) - g.start)} of overlap)",
                    )
                )
            if holder is None or (g.end or 0) > (holder.end or 0):
                holder = g
    return out


def check_detection(m: Model, slack_ms: int = DEFAULT_SLACK_MS) -> list[Violation]:
    """A grant superseded while its holder still had it (another grant of the name completed
    before its release began) must have been reported lost to its holder by
    max(its validity end, the superseding grant) + slack, or by the end of a pause of its
    process (+ slack) that covered that moment."""
    out: list[Violation] = []
    slack = slack_ms * 1_000_000
    pauses = pauses_of(m.nemesis, m.last_t)
    by_name: dict[str, list[Grant]] = {}
    for g in m.grants:
        by_name.setdefault(g.name, []).append(g)
    for name, gs in by_name.items():
        for a in gs:
            cut = a.release.invoke_t if a.release is not None else m.ends.get(a.p, m.last_t)
            if a.p in m.killed and m.killed[a.p] <= cut:
                continue  # a dead holder believes nothing
            sup = [b for b in gs if b is not a and b.token > a.token and a.start < b.start < cut]
            if not sup:
                continue
            b = min(sup, key=lambda b: b.start)
            deadline = max(a.valid_until or a.start, b.start) + slack
            for s, e in pauses.get(a.p, []):
                if s <= deadline and e >= a.start:
                    deadline = max(deadline, e + slack)
            if a.signal_t is None:
                out.append(
                    Violation(
                        "detection",
                        f"{name}: {a.p}'s lease (token {a.token}) was superseded by {b.p}'s token {b.token} "
                        "and its holder was never told it lost it",
                    )
                )
            elif a.signal_t > deadline:
                out.append(
                    Violation(
                        "detection",
                        f"{name}: {a.p}'s lease (token {a.token}) was superseded by {b.p}'s token {b.token}; "
                        f"the loss ({a.signal}) came {ms(a.signal_t - deadline + slack)} after its validity "
                        "ended and no pause covers it",
                    )
                )
    return out


def check_set(m: Model, final: dict[str, list[int]]) -> list[Violation]:
    """The fenced set: see README.md ("lock-set checks")."""
    out: list[Violation] = []
    writes = [op for op in m.ops if op.f == "write"]
    by_name: dict[str, list[Op]] = {}
    for w in writes:
        by_name.setdefault(w.name, []).append(w)
    for name in sorted(set(by_name) | set(final)):
        ws = by_name.get(name, [])
        got = final.get(name)
        if got is None:
            if any(w.type == "ok" for w in ws):
                out.append(Violation("set", f"{name}: acknowledged writes but no final read of the set"))
            continue
        final_set = set(got)
        if len(final_set) != len(got):
            out.append(Violation("set", f"{name}: the final set holds a value twice"))
        attempted = {w.inv.get("value"): w for w in ws}
        for v in sorted(final_set - set(attempted)):
            out.append(Violation("set", f"{name}: value {v} in the final set was never written"))
        for w in ws:
            v = w.inv.get("value")
            if w.type == "ok" and v not in final_set:
                out.append(Violation("lost write", f"{name}: {w.p}'s acknowledged write {v} (token {w.get('token')}) is not in the final set"))
            if w.type == "fail" and v in final_set:
                out.append(Violation("set", f"{name}: {w.p}'s write {v} failed ({w.get('error')}) yet is in the final set"))
        accepted = [w for w in ws if w.inv.get("value") in final_set]
        # Serialization order: a committed transaction that read r values was the (r+1)-th.
        known = sorted((w for w in accepted if w.type == "ok" and isinstance(w.get("read"), int)), key=lambda w: w.get("read"))
        for a, b in zip(known, known[1:]):
            if a.get("read") == b.get("read"):
                out.append(
                    Violation(
                        "lost update",
                        f"{name}: {a.p} (token {a.get('token')}) and {b.p} (token {b.get('token')}) both read "
                        f"{a.get('read')} values and both committed: one missed the other's write",
                    )
                )
        for w in known:
            if w.get("read") >= len(final_set):
                out.append(Violation("set", f"{name}: {w.p} read {w.get('read')} values; the final set has {len(final_set)}"))
        top: Op | None = None
        for w in known:
            if top is not None and w.get("token") < top.get("token"):
                out.append(
                    Violation(
                        "stale write accepted",
                        f"{name}: {w.p}'s write with token {w.get('token')} committed after {top.p}'s with "
                        f"token {top.get('token')} (it read {w.get('read')} values, that one {top.get('read')})",
                    )
                )
            if top is None or w.get("token") > top.get("token"):
                top = w
        # Real-time order, which also covers writes of unknown outcome that landed.
        done = sorted((w for w in accepted if w.type == "ok"), key=lambda w: w.done_t)
        for w in accepted:
            earlier = [a for a in done if a.done_t < w.invoke_t]
            if not earlier:
                continue
            hi = max(earlier, key=lambda a: a.get("token"))
            if w.get("token") < hi.get("token"):
                out.append(
                    Violation(
                        "stale write accepted",
                        f"{name}: {w.p}'s write with token {w.get('token')} was accepted, invoked after "
                        f"{hi.p}'s write with token {hi.get('token')} had committed",
                    )
                )
            if isinstance(w.get("read"), int) and w.type == "ok":
                missed = [a for a in earlier if isinstance(a.get("read"), int) and a.get("read") >= w.get("read")]
                if missed:
                    a = missed[0]
                    out.append(
                        Violation(
                            "lost update",
                            f"{name}: {w.p} read {w.get('read')} values, invoked after {a.p}'s write (which "
                            f"had read {a.get('read')}) committed",
                        )
                    )
    return _dedupe(out)


def check_liveness(
    m: Model, ttl_ms: int, bound_ms: int = DEFAULT_BOUND_MS, handoff_ms: int = HANDOFF_BOUND_MS
) -> list[Violation]:
    """After the last heal (or the start, without faults), some acquire succeeds within
    TTL + bound; after a holder is paused or killed, another process acquires within TTL +
    bound (where the run went on that long)."""
    out: list[Violation] = []
    span = (ttl_ms + bound_ms) * 1_000_000
    ends = [ev["t"] for ev in m.nemesis if ev.get("f") == "end"]
    run_end = max(ends) if ends else m.last_t
    # A paused or killed holder blocks the name for at most its TTL + the handoff bound:
    # another process gets it by then.
    hand = (ttl_ms + handoff_ms) * 1_000_000
    for ev in m.nemesis:
        target = ev.get("process")
        if ev.get("f") not in ("pause", "kill") or not isinstance(target, str) or ev["t"] + hand > run_end:
            continue
        if not any(g.p != target and ev["t"] <= g.start <= ev["t"] + hand for g in m.grants):
            out.append(Violation("liveness", f"no process but {target} acquired within {ttl_ms + handoff_ms} ms of its {ev['f']}"))
    heals = [ev["t"] for ev in m.nemesis if ev.get("f") in ("heal", "begin")]
    if not heals:
        return out
    t0 = max(heals)
    if any(t0 <= g.start <= t0 + span for g in m.grants):
        return out
    if run_end < t0 + span:
        return out + [Violation("liveness", f"no acquire succeeded in the {ms(run_end - t0)} after the last heal (the run ended before TTL + bound)")]
    return out + [Violation("liveness", f"no acquire succeeded within {ttl_ms + bound_ms} ms of the last heal")]


def _dedupe(vs: list[Violation]) -> list[Violation]:
    seen, out = set(), []
    for v in vs:
        if (v.check, v.message) not in seen:
            seen.add((v.check, v.message))
            out.append(v)
    return out


def check(
    events: list[dict[str, Any]],
    final: dict[str, list[int]] | None = None,
    *,
    exclusion: bool = True,
    detection: bool = True,
    ttl_ms: int | None = None,
    bound_ms: int = DEFAULT_BOUND_MS,
    slack_ms: int = DEFAULT_SLACK_MS,
) -> list[Violation]:
    """Every applicable check over a merged history. ``final`` maps a resource name to the values
    its set holds after the run (None: no lock-set workload); ``exclusion`` only where no pause,
    clock step or data-losing server fault ran; ``detection`` only where the service cannot
    grant a name twice behind a holder's back (no failover to a stale master, no paused
    server); liveness only with ``ttl_ms``."""
    m = build(merge([events]))
    out = check_fences(m)
    if detection:
        out += check_detection(m, slack_ms)
    if exclusion:
        out += check_exclusion(m)
    if final is not None:
        out += check_set(m, final)
    if ttl_ms is not None:
        out += check_liveness(m, ttl_ms, bound_ms)
    return out


def stats(events: list[dict[str, Any]]) -> dict[str, int]:
    """Counts for the results table."""
    m = build(merge([events]))
    return {
        "ops": len(m.ops),
        "grants": len(m.grants),
        "acquire_fail": sum(1 for op in m.ops if op.f == "acquire" and op.type in ("fail", "info")),
        "writes_ok": sum(1 for op in m.ops if op.f == "write" and op.type == "ok"),
        "writes_stale": sum(1 for op in m.ops if op.f == "write" and op.type == "fail"),
        "lost": len(m.lost),
        "faults": sum(1 for ev in m.nemesis if ev.get("f") in ("pause", "kill", "fault", "clock-step")),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("history")
    ap.add_argument("--final", help="JSON file: {resource: [values]} read after the run")
    ap.add_argument("--no-exclusion", action="store_true")
    ap.add_argument("--ttl-ms", type=int)
    ap.add_argument("--bound-ms", type=int, default=DEFAULT_BOUND_MS)
    ap.add_argument("--slack-ms", type=int, default=DEFAULT_SLACK_MS)
    args = ap.parse_args()
    with open(args.history, encoding="utf-8") as f:
        events = parse(f)
    final = None
    if args.final:
        with open(args.final, encoding="utf-8") as f:
            final = json.load(f)
    vs = check(events, final, exclusion=not args.no_exclusion, ttl_ms=args.ttl_ms, bound_ms=args.bound_ms, slack_ms=args.slack_ms)
    for v in vs:
        print(v)
    print(f"check.py: {len(vs)} violation(s); {stats(events)}")
    return 1 if vs else 0


if __name__ == "__main__":
    sys.exit(main())

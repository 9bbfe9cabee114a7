"""The checkers on small hand-made histories: each must pass the good ones and catch the bad ones."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from check import HistoryError, check, parse  # noqa: E402

MS = 1_000_000


class H:
    """A history under construction; times in ms."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def ev(self, p: str, t: int, type_: str, f: str, **kw: object) -> "H":
        e = {"p": p, "t": t * MS, "type": type_, "f": f, "name": "r"}
        for k, v in kw.items():
            e[k] = v * MS if k == "valid_until" and isinstance(v, int) else v
        self.events.append(e)
        return self

    def grant(self, p: str, t0: int, t1: int, token: int, valid_until: int | None = None) -> "H":
        self.ev(p, t0, "invoke", "acquire")
        return self.ev(p, t1, "ok", "acquire", token=token, valid_until=valid_until if valid_until is not None else t1 + 1000)

    def write(self, p: str, t0: int, t1: int, token: int, value: int, read: int | None, type_: str = "ok", error: str | None = None) -> "H":
        self.ev(p, t0, "invoke", "write", token=token, value=value)
        return self.ev(p, t1, type_, "write", token=token, value=value, read=read, error=error)

    def release(self, p: str, t0: int, t1: int, token: int, error: str | None = None) -> "H":
        self.ev(p, t0, "invoke", "release", token=token)
        return self.ev(p, t1, "ok" if error is None else "fail", "release", token=token, error=error)

    def nem(self, t: int, f: str, **kw: object) -> "H":
        self.events.append({"p": "nemesis", "t": t * MS, "type": "info", "f": f, **kw})
        return self


def checks(vs: list) -> set[str]:
    return {v.check for v in vs}


def good_run() -> H:
    h = H()
    h.grant("a", 0, 1, 10).write("a", 2, 3, 10, 1, 0).release("a", 4, 5, 10)
    h.grant("b", 1, 6, 11).write("b", 7, 8, 11, 2, 1).release("b", 9, 10, 11)
    h.grant("a", 11, 12, 12).write("a", 13, 14, 12, 3, 2).release("a", 15, 16, 12)
    return h


def test_a_clean_run_passes() -> None:
    assert check(good_run().events, {"r": [1, 2, 3]}, ttl_ms=1000) == []


def test_a_lost_acknowledged_write() -> None:
    assert checks(check(good_run().events, {"r": [1, 3]})) == {"lost write", "set"}


def test_a_value_nobody_wrote() -> None:
    assert checks(check(good_run().events, {"r": [1, 2, 3, 99]})) == {"set"}


def test_a_stale_write_accepted_after_a_pause() -> None:
    # a holds 10, is paused past its validity, b takes 11 and writes; a wakes and its write with
    # 10 is accepted (no gate): the control's failure.
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100)
    h.nem(2, "pause", process="a")
    h.grant("b", 50, 150, 11).write("b", 151, 152, 11, 2, 0).release("b", 153, 154, 11)
    h.nem(300, "resume", process="a")
    h.write("a", 301, 302, 10, 1, 1).ev("a", 303, "info", "lost", token=10, error="expired")
    h.release("a", 304, 305, 10, error="lost")
    vs = check(h.events, {"r": [1, 2]}, exclusion=False)
    assert checks(vs) == {"stale write accepted"}, vs


def test_the_same_pause_with_the_gate_passes() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100)
    h.nem(2, "pause", process="a")
    h.grant("b", 50, 150, 11).write("b", 151, 152, 11, 2, 0).release("b", 153, 154, 11)
    h.nem(300, "resume", process="a")
    h.write("a", 301, 302, 10, 1, None, type_="fail", error="stale")
    h.ev("a", 303, "info", "lost", token=10, error="expired").release("a", 304, 305, 10, error="lost")
    assert check(h.events, {"r": [2]}, exclusion=False) == []


def test_two_writers_reading_the_same_state_is_a_lost_update() -> None:
    h = H()
    h.grant("a", 0, 1, 10).write("a", 2, 8, 10, 1, 0).release("a", 9, 10, 10)
    h.grant("b", 3, 4, 11).write("b", 5, 7, 11, 2, 0).release("b", 11, 12, 11)
    vs = check(h.events, {"r": [1, 2]}, exclusion=False)
    assert "lost update" in checks(vs), vs


def test_a_read_that_missed_a_committed_write_is_a_lost_update() -> None:
    h = H()
    h.grant("a", 0, 1, 10).write("a", 2, 3, 10, 1, 0).release("a", 4, 5, 10)
    h.grant("b", 6, 7, 11).write("b", 8, 9, 11, 2, 0).release("b", 10, 11, 11)
    assert "lost update" in checks(check(h.events, {"r": [1, 2]}))


def test_a_write_of_unknown_outcome_may_land_or_not() -> None:
    h = H()
    h.grant("a", 0, 1, 10).write("a", 2, 3, 10, 1, None, type_="info", error="connection reset")
    h.release("a", 4, 5, 10)
    assert check(h.events, {"r": [1]}) == []
    assert check(h.events, {"r": []}) == []


def test_an_unknown_write_that_landed_with_a_stale_token() -> None:
    h = H()
    h.grant("b", 0, 1, 11).write("b", 2, 3, 11, 2, 0).release("b", 4, 5, 11)
    h.ev("a", 6, "invoke", "write", token=10, value=1).ev("a", 7, "info", "write", token=10, value=1, error="timeout")
    assert "stale write accepted" in checks(check(h.events, {"r": [1, 2]}, exclusion=False))


def test_a_fence_that_went_back() -> None:
    h = H()
    h.grant("a", 0, 1, 10).release("a", 2, 3, 10)
    h.grant("b", 4, 5, 9).release("b", 6, 7, 9)
    assert checks(check(h.events)) == {"fences"}


def test_a_token_granted_twice() -> None:
    h = H()
    h.grant("a", 0, 1, 10).release("a", 2, 3, 10)
    h.grant("b", 4, 5, 10).release("b", 6, 7, 10)
    assert "fences" in checks(check(h.events))


def test_concurrent_acquires_do_not_order_their_tokens() -> None:
    # b's acquire was invoked before a's completed: either order is linearizable.
    h = H()
    h.grant("b", 0, 3, 9).release("b", 4, 5, 9)
    h.grant("a", 1, 2, 10)
    h.events.sort(key=lambda e: e["t"])
    assert checks(check(h.events, exclusion=False)) == set()


def test_overlapping_holders() -> None:
    h = H()
    h.grant("a", 0, 1, 10).grant("b", 2, 3, 11).release("a", 4, 5, 10).release("b", 6, 7, 11)
    h.events.sort(key=lambda e: e["t"])
    assert "exclusion" in checks(check(h.events))
    assert "exclusion" not in checks(check(h.events, exclusion=False))


def test_a_killed_holder_does_not_overlap() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=500).nem(2, "kill", process="a")
    h.grant("b", 3, 600, 11).release("b", 601, 602, 11)
    assert check(h.events) == []


def test_a_superseded_holder_never_told() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100).grant("b", 2, 150, 11).release("b", 151, 152, 11)
    h.release("a", 400, 401, 10)
    h.events.sort(key=lambda e: e["t"])
    assert checks(check(h.events, exclusion=False)) == {"detection"}


def test_a_loss_reported_late_without_a_pause() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100).grant("b", 2, 150, 11).release("b", 151, 152, 11)
    h.ev("a", 2000, "info", "lost", token=10, error="expired").release("a", 2001, 2002, 10, error="lost")
    h.events.sort(key=lambda e: e["t"])
    assert checks(check(h.events, exclusion=False)) == {"detection"}


def test_a_loss_reported_late_after_a_pause_is_fine() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100).nem(50, "pause", process="a")
    h.grant("b", 2, 150, 11).release("b", 151, 152, 11)
    h.nem(1900, "resume", process="a")
    h.ev("a", 2000, "info", "lost", token=10, error="expired").release("a", 2001, 2002, 10, error="lost")
    h.events.sort(key=lambda e: e["t"])
    assert check(h.events, exclusion=False) == []


def test_a_loss_reported_in_time() -> None:
    h = H()
    h.grant("a", 0, 1, 10, valid_until=100).ev("a", 99, "info", "lost", token=10, error="renewal rejected")
    h.grant("b", 2, 150, 11).release("b", 151, 152, 11).release("a", 300, 301, 10, error="lost")
    h.events.sort(key=lambda e: e["t"])
    assert check(h.events) == []


def test_liveness_after_the_last_heal() -> None:
    h = H()
    h.nem(0, "begin").grant("a", 0, 1, 10).release("a", 2, 3, 10)
    h.nem(10, "fault", what="x").nem(20, "heal").nem(20 + 5000, "end")
    assert checks(check(h.events, ttl_ms=1000, bound_ms=1000)) == {"liveness"}
    h.grant("b", 100, 1500, 11).release("b", 1501, 1502, 11)
    h.events.sort(key=lambda e: e["t"])
    assert check(h.events, ttl_ms=1000, bound_ms=1000) == []


def test_malformed_histories_are_refused() -> None:
    with pytest.raises(HistoryError):
        parse(['{"p": "a", "t": 1, "type": "invoke", "f": "acquire"', ""])
    with pytest.raises(HistoryError):
        parse(['{"p": "a", "t": "soon", "type": "ok"}'])
    with pytest.raises(HistoryError):
        check(H().ev("a", 1, "ok", "acquire", token=1).events)
    with pytest.raises(HistoryError):
        check(H().ev("a", 1, "invoke", "acquire").ev("a", 2, "invoke", "write").events)


def test_a_paused_holder_must_not_block_the_name_past_its_ttl() -> None:
    h = H()
    h.nem(0, "begin").grant("a", 0, 1, 10, valid_until=1000).nem(2, "pause", process="a")
    h.nem(3000, "resume", process="a").nem(3000, "heal").release("a", 3001, 3002, 10, error="lost")
    h.grant("a", 3003, 3004, 13).release("a", 3005, 3006, 13).nem(9000, "end")
    assert checks(check(h.events, exclusion=False, ttl_ms=1000, bound_ms=1000)) == {"liveness"}
    h.grant("b", 5, 1500, 12).release("b", 1501, 1502, 12)
    h.events.sort(key=lambda e: e["t"])
    assert check(h.events, exclusion=False, ttl_ms=1000, bound_ms=1000) == []


CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")


def load(name: str) -> list:
    with open(os.path.join(CASES, name), encoding="utf-8") as f:
        return parse(f)


def test_a_real_overlap_after_an_etcd_leader_was_resumed() -> None:
    # Excerpt of the long run's etcd/lock-set/member-stop, seed 1484382033 (docs/histories.md):
    # two holders for 58.5 ms; the first one's release found not_owner, before its validity
    # ended, so detection holds and exclusion does not.
    vs = check(load("etcd-member-stop-overlap.jsonl"))
    assert checks(vs) == {"exclusion"}, vs


def test_a_real_split_brain_after_a_sentinel_failover() -> None:
    # Excerpt of the long run's redis-sentinel/lock-set/master-kill, seed 1484382034: the C++
    # holder's grant was superseded by the Go worker's and its release still said released.
    vs = check(load("sentinel-split-brain.jsonl"), exclusion=False)
    assert checks(vs) == {"detection"}, vs


def test_a_real_stall_behind_a_paused_redis_holder() -> None:
    # Excerpt of redis/lock-set/pause, seed 5001 (docs/histories.md): the holder is SIGSTOP'd
    # with 1 s of validity left; three waiters see the name free from its expiry until a fresh
    # acquire 1.6 s later, while their 2 s waits run out.
    vs = check(load("redis-pause-stall.jsonl"), exclusion=False, ttl_ms=1000)
    assert checks(vs) == {"liveness"}, vs

"""Every bad input gets a clear exception; the ctypes layer maps statuses to typed errors."""

from __future__ import annotations

import datetime
import math
import os
import subprocess
import sys

import pytest

import leasehold
from leasehold import (
    ClientClosed,
    Config,
    CoreError,
    InvalidArgument,
    LockClient,
    LockNotHeld,
    LockTimeout,
)
from leasehold import _ffi
from leasehold._core import Core
from leasehold.errors import CorePanic, CorePoisoned, LeaseEnded, NotGranted, UnknownLease
from leasehold.testing import FakeClock, MemoryLockService


@pytest.mark.parametrize("name", [123, b"bytes", None, 1.5, ["x"]])
def test_name_wrong_type(make_client, name: object) -> None:
    c = make_client()
    with pytest.raises(TypeError, match="lock name must be a str"):
        c.acquire(name, ttl=3)  # type: ignore[arg-type]


def test_empty_name(make_client) -> None:
    with pytest.raises(ValueError, match="empty"):
        make_client().acquire("", ttl=3)


def test_name_too_long_is_core_error_with_status_name(make_client) -> None:
    with pytest.raises(InvalidArgument) as ei:
        make_client().acquire("n" * 513, ttl=3)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.status == _ffi.LH_ERR_NAME_TOO_LONG
    assert e.status_name == "LH_ERR_NAME_TOO_LONG"
    assert "LH_ERR_NAME_TOO_LONG" in str(e)
    assert e.detail  # the handle's detail message


def test_name_of_exactly_max_len_is_fine(make_client) -> None:
    make_client().acquire("n" * 512, ttl=3).release()


def test_name_with_nul(make_client) -> None:
    with pytest.raises(InvalidArgument) as ei:
        make_client().acquire("a\x00b", ttl=3)
    assert ei.value.status_name == "LH_ERR_NAME_HAS_NUL"


def test_name_with_lone_surrogate(make_client) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        make_client().acquire("bad\udc80", ttl=3)


def test_unicode_name_round_trips(make_client, store) -> None:
    h = make_client().acquire("zäh-锁-🔒", ttl=3)
    assert store.holder("zäh-锁-🔒") is not None
    h.release()


@pytest.mark.parametrize("ttl", [-1, -0.5, 0, 0.0001])
def test_non_positive_ttl(make_client, ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        make_client().acquire("t", ttl=ttl)


@pytest.mark.parametrize("ttl", [math.nan, math.inf, -math.inf])
def test_non_finite_ttl(make_client, ttl: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        make_client().acquire("t", ttl=ttl)


@pytest.mark.parametrize("ttl", ["3", None, True, [3]])
def test_ttl_wrong_type(make_client, ttl: object) -> None:
    with pytest.raises(TypeError, match="ttl"):
        make_client().acquire("t", ttl=ttl)  # type: ignore[arg-type]


def test_ttl_too_short_for_cadence(make_client) -> None:
    with pytest.raises(InvalidArgument) as ei:
        make_client().acquire("t", ttl=0.005)
    assert ei.value.status_name == "LH_ERR_INVALID_TTL"
    assert "short" in str(ei.value)


def test_ttl_above_max(make_client) -> None:
    with pytest.raises(InvalidArgument) as ei:
        make_client().acquire("t", ttl=8 * 86_400)
    assert ei.value.status_name == "LH_ERR_INVALID_TTL"


def test_ttl_as_timedelta(make_client) -> None:
    h = make_client().acquire("td", ttl=datetime.timedelta(seconds=2))
    assert h.ttl == 2.0
    h.release()


@pytest.mark.parametrize("wait", [-1, math.nan, math.inf])
def test_bad_wait_value(make_client, wait: float) -> None:
    with pytest.raises(ValueError, match="wait"):
        make_client().acquire("w", ttl=3, wait=wait)


def test_bad_wait_type(make_client) -> None:
    with pytest.raises(TypeError, match="wait"):
        make_client().acquire("w", ttl=3, wait="5")  # type: ignore[arg-type]


def test_bad_reentrant_and_on_lost(make_client) -> None:
    c = make_client()
    with pytest.raises(TypeError, match="reentrant"):
        c.acquire("x", ttl=3, reentrant=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_lost"):
        c.acquire("x", ttl=3, on_lost="not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callback"):
        c.on_release("x", 42)  # type: ignore[arg-type]


def test_bad_inputs_leave_client_usable(make_client) -> None:
    c = make_client()
    for bad in ("", "a\x00"):
        with pytest.raises(ValueError):
            c.acquire(bad, ttl=3)
    h = c.acquire("ok", ttl=3)
    assert h.fencing_token == 1
    assert c.counters().live_leases == 1


def test_use_after_release(make_client) -> None:
    c = make_client()
    h = c.acquire("u", ttl=3)
    h.release()
    h.release()
    assert not h.is_held()
    assert h.valid_until is None and h.remaining() == 0.0
    assert h.fencing_token == 1  # the token of that grant stays readable
    with pytest.raises(LockNotHeld):
        with h:
            pass


def test_closed_client(make_client) -> None:
    c = make_client()
    h = c.acquire("c", ttl=3)
    c.close()
    with pytest.raises(ClientClosed):
        c.acquire("c", ttl=3)
    with pytest.raises(ClientClosed):
        c.on_release("c", lambda n: None)
    with pytest.raises(ClientClosed):
        c.counters()
    assert isinstance(ClientClosed("x"), RuntimeError)
    assert not h.is_held()
    h.release()  # no error after close


def test_bad_constructor_arguments(clock: FakeClock) -> None:
    with pytest.raises(TypeError, match="LockService"):
        LockClient(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="io_workers"):
        LockClient(MemoryLockService(clock=clock), io_workers=0)
    with pytest.raises(TypeError, match="clock"):
        LockClient(MemoryLockService(clock=clock), clock=42)
    with pytest.raises(TypeError, match="Config"):
        LockClient(MemoryLockService(clock=clock), config={"fail_budget": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drift_ppm"):
        LockClient(MemoryLockService(clock=clock), config=Config(drift_ppm="x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as ei:
        LockClient(MemoryLockService(clock=clock), seed=b"short")
    assert ei.value.status_name == "LH_ERR_SEED_TOO_SHORT"
    with pytest.raises(InvalidArgument) as ei:
        LockClient(MemoryLockService(clock=clock), config=Config(backoff_base_ns=10, backoff_cap_ns=1))
    assert ei.value.status_name == "LH_ERR_INVALID_CONFIG"


def test_lock_timeout_is_the_one_way_to_report_not_acquired(make_client) -> None:
    a, b = make_client(), make_client()
    a.acquire("one", ttl=3)
    with pytest.raises(LockTimeout):
        b.acquire("one", ttl=3, wait=0)
    assert issubclass(LockTimeout, TimeoutError)


# ---- the Core wrapper and the ctypes table --------------------------------------------------------
def test_core_outputs_and_getters() -> None:
    clock = FakeClock()
    core = Core(seed=bytes(range(32)), clock=clock.monotonic_ns)
    assert core.poll_timeout() is None
    assert core.poll_output() is None
    lease = core.acquire("job", 3000)
    out = core.poll_output()
    assert out is not None and out.kind == _ffi.LH_OUTPUT_ACQUIRE
    assert out.name == "job" and out.lease_id == lease and out.ttl_ms == 3000
    assert len(out.token) == 32 and int(out.token, 16) >= 0
    with pytest.raises(NotGranted):
        core.fencing_token(lease)
    info = core.lease_info(lease)
    assert info.state_name == "acquiring" and info.fencing_token is None
    clock.advance(0.001)
    core.acquire_result(out.request_id, _ffi.LH_ACQUIRE_GRANTED, 7, 3000)
    ev = core.poll_output()
    assert ev is not None and ev.kind == _ffi.LH_OUTPUT_ACQUIRED and ev.fencing_token == 7
    assert core.fencing_token(lease) == 7
    assert core.is_held(lease)
    assert core.valid_until(lease) == ev.valid_until_ns
    assert core.lease_state(lease) == _ffi.LH_STATE_HELD
    # a stale (unknown) request id is ignored and counted
    core.renew_result(999_999, _ffi.LH_RENEW_REJECTED)
    assert core.counters().stale_results == 1
    assert core.is_held(lease)
    with pytest.raises(UnknownLease):
        core.lease_state(lease + 12345)
    with pytest.raises(InvalidArgument) as ei:
        core.renew_result(1, 77)
    assert ei.value.status_name == "LH_ERR_INVALID_ENUM"
    core.release(lease)
    kinds = []
    while (o := core.poll_output()) is not None:
        kinds.append(o.kind)
    assert kinds == [_ffi.LH_OUTPUT_RELEASED, _ffi.LH_OUTPUT_RELEASE]
    with pytest.raises(LeaseEnded):
        core.release(lease)
    core.close()
    core.close()
    with pytest.raises(ClientClosed):
        core.poll_output()


def test_core_same_seed_same_tokens_reseed_differs() -> None:
    def first_token(c: Core) -> str:
        c.acquire("x", 3000)
        o = c.poll_output()
        assert o is not None
        return o.token

    a, b = Core(seed=b"s" * 32), Core(seed=b"s" * 32)
    assert first_token(a) == first_token(b)
    b.reseed(b"t" * 32)
    assert first_token(a) != first_token(b)
    with pytest.raises(InvalidArgument):
        a.reseed(b"short")


def test_core_panic_poisons_handle() -> None:
    core = Core()
    with pytest.raises(CorePanic) as ei:
        core.debug_panic()
    assert ei.value.status_name == "LH_ERR_PANIC"
    with pytest.raises(CorePoisoned):
        core.acquire("x", 3000)
    assert isinstance(ei.value, CoreError)


def test_status_names_and_abi() -> None:
    assert _ffi.status_name(_ffi.LH_OK) == "LH_OK"
    assert _ffi.status_name(_ffi.LH_ERR_EMPTY_NAME) == "LH_ERR_EMPTY_NAME"
    assert int(_ffi.lib.lh_abi_version()) == _ffi.ABI_VERSION
    assert leasehold.CORE_VERSION == "0.1.0"
    assert Config.defaults()["fail_budget"] == 0  # the time budget


def test_loader_reports_missing_library_clearly(tmp_path) -> None:
    env = dict(os.environ, LEASEHOLD_LIBRARY=str(tmp_path / "nope.so"))
    p = subprocess.run([sys.executable, "-c", "import leasehold; leasehold.LockClient"], env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert "LEASEHOLD_LIBRARY" in p.stderr and "does not name a file" in p.stderr


def test_loader_reports_abi_mismatch(tmp_path) -> None:
    code = (
        "import leasehold._ffi as f, leasehold.errors as e\n"
        "f.ABI_VERSION = 999\n"
        "try:\n    f._check_abi()\nexcept e.LibraryError as x:\n    print('ERR', x)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "ERR leasehold ABI mismatch" in p.stdout and "999" in p.stdout


def test_config_values_out_of_range_are_not_truncated(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="drift_ppm"):
        LockClient(MemoryLockService(clock=clock), config=Config(drift_ppm=2**32 + 5))
    with pytest.raises(ValueError, match="request_timeout_ns"):
        LockClient(MemoryLockService(clock=clock), config=Config(request_timeout_ns=-1))


def test_huge_wait_is_accepted_and_bounded(make_client) -> None:
    a, b = make_client(), make_client()
    h = a.acquire("huge", ttl=3)
    with pytest.raises(ValueError, match="wait"):
        b.acquire("huge", ttl=3, wait=1e12)  # beyond the core's u64 nanoseconds
    h.release()
    h2 = b.acquire("huge", ttl=3, wait=1e10)  # free: granted at once despite the huge budget
    assert h2.is_held()


class _Odd(MemoryLockService):
    """A service returning garbage: every answer must become a transport error, never a grant."""

    def __init__(self, clock: FakeClock, answer: object) -> None:
        super().__init__(clock=clock)
        self.answer = answer

    def acquire(self, name: str, token: str, ttl_ms: int):  # type: ignore[no-untyped-def]
        self.calls["acquire"] += 1
        self.called["acquire"].set()
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "granted",
        True,
        leasehold.Granted(fencing_token=-1, ttl_ms=3000),
        leasehold.Granted(fencing_token="7", ttl_ms=3000),  # type: ignore[arg-type]
        leasehold.Granted(fencing_token=1, ttl_ms=3000, backend_data=b"x" * 5000),
        leasehold.HeldByOther(retry_after_ms=-5),
    ],
    ids=["none", "str", "bool", "negative-token", "str-token", "huge-backend-data", "negative-hint"],
)
def test_misbehaving_service_never_grants_and_driver_survives(clock: FakeClock, answer: object) -> None:
    from core_helpers import Result

    from leasehold.testing import settle

    c = LockClient(_Odd(clock, answer), clock=clock)
    try:
        r = Result(lambda: c.acquire("odd", ttl=3, wait=1))
        assert c.service.called["acquire"].wait(5)  # type: ignore[attr-defined]
        settle(clock, [c], seconds=4, step=0.1)
        with pytest.raises(LockTimeout):
            r.get()
        assert c.service.calls["acquire"] >= 1  # type: ignore[attr-defined]
        # The driver is alive: a well-behaved answer afterwards is granted.
        c.service.answer = leasehold.Granted(fencing_token=9, ttl_ms=3000)  # type: ignore[attr-defined]
        h = c.acquire("odd", ttl=3, wait=1)
        assert h.fencing_token == 9
    finally:
        c.close(timeout=0.2)


def test_core_output_fields_per_kind_and_backend_data_round_trip() -> None:
    """Commands carry name/token (and backend data from the grant); events carry none; a
    polled Output is immutable."""
    clock = FakeClock()
    core = Core(seed=bytes(range(32)), clock=clock.monotonic_ns)
    lease = core.acquire("jöb", 3000)
    cmd = core.poll_output()
    assert cmd is not None and cmd.kind == _ffi.LH_OUTPUT_ACQUIRE
    assert cmd.name == "jöb" and len(cmd.token) == 32 and cmd.backend_data == b""
    with pytest.raises(AttributeError):
        cmd.name = "other"  # type: ignore[misc]
    core.acquire_result(cmd.request_id, _ffi.LH_ACQUIRE_GRANTED, 9, 3000, backend_data=b"\x00bd\x00")
    ev = core.poll_output()
    assert ev is not None and ev.kind == _ffi.LH_OUTPUT_ACQUIRED and ev.lease_id == lease
    assert (ev.name, ev.token, ev.backend_data, ev.fencing_token) == ("", "", b"", 9)
    assert ev.reason_name  # "none" or the number; never raises
    core.release(lease)
    outs = []
    while (o := core.poll_output()) is not None:
        outs.append(o)
    released, rel = outs
    assert released.kind == _ffi.LH_OUTPUT_RELEASED and released.name == "" and released.token == ""
    assert rel.kind == _ffi.LH_OUTPUT_RELEASE and rel.name == "jöb" and rel.token == cmd.token
    assert rel.backend_data == b"\x00bd\x00"
    core.release_result(rel.request_id, _ffi.LH_RELEASE_RELEASED)
    assert core.poll_output() is None
    # a waiter's Watch carries only the name
    other = Core(seed=bytes(range(1, 33)), clock=clock.monotonic_ns)
    other.acquire("jöb", 3000, wait_ns=10**9)
    acq = other.poll_output()
    assert acq is not None and acq.kind == _ffi.LH_OUTPUT_ACQUIRE
    other.acquire_result(acq.request_id, _ffi.LH_ACQUIRE_HELD_BY_OTHER, retry_after_ms=500)
    kinds = {}
    while (o := other.poll_output()) is not None:
        kinds[o.kind] = o
    watch = kinds.get(_ffi.LH_OUTPUT_WATCH)
    assert watch is not None and watch.name == "jöb" and watch.token == "" and watch.request_id == 0
    other.released("jöb")
    core.close()
    other.close()

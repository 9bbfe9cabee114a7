"""Every bad input gets a clear exception; the ctypes layer maps statuses to typed errors."""

from __future__ import annotations

import datetime
import logging
import math
import os
import subprocess
import sys
import threading
from typing import Any

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
from leasehold._backend import step_received
from leasehold._core import Answer, Core, EtcdOptions, IoRequest, RedisOptions, SqlOptions
from leasehold._options import RedisStreamOptions
from leasehold.errors import CorePanic, CorePoisoned, LeaseEnded, NotGranted, UnknownLease
from leasehold.testing import FakeClock, MemoryExecutor, MemoryLockService, MemoryService


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
    with pytest.raises(TypeError, match="backend executor"):
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
    shared = MemoryLockService(clock=clock)
    with LockClient(shared, clock=clock, owns_service=False):
        with pytest.raises(ValueError, match="already serves a client; make one per client"):
            LockClient(shared, clock=clock)
    with LockClient(shared, clock=clock) as again:  # free again once its client closed
        again.acquire("n", ttl=3).release()


def test_lock_timeout_is_the_one_way_to_report_not_acquired(make_client) -> None:
    a, b = make_client(), make_client()
    a.acquire("one", ttl=3)
    with pytest.raises(LockTimeout):
        b.acquire("one", ttl=3, wait=0)
    assert issubclass(LockTimeout, TimeoutError)


# ---- the Core wrapper and the ctypes table --------------------------------------------------------
def _answer(core: Core, ex: MemoryExecutor) -> list[IoRequest]:
    """Hand every request the core polls to the memory service (as the executor does); the
    requests, in order."""
    done = []
    while reqs := core.poll_io():
        for r in reqs:
            assert r.kind == _ffi.LH_IO_COMMAND and r.connection == _ffi.LH_CONNECTION_COMMANDS
            core.reply(r.id, ex.command(r.payload))
            done.append(r)
    return done


def test_core_requests_events_and_getters() -> None:
    clock = FakeClock()
    ex = MemoryExecutor(MemoryService(clock=clock))
    core = Core(seed=bytes(range(32)), clock=clock.monotonic_ns)
    assert core.protocol == "memory"
    assert core.poll_timeout() is None and core.poll_event() is None and core.poll_io() == []
    lease = core.acquire("job", 3000)
    (req,) = core.poll_io()
    assert req.id > 0 and isinstance(req.payload, list) and all(isinstance(a, bytes) for a in req.payload)
    with pytest.raises(NotGranted):
        core.fencing_token(lease)
    info = core.lease_info(lease)
    assert info.state_name == "acquiring" and info.fencing_token is None
    clock.advance(0.001)
    core.reply(req.id, ex.command(req.payload))
    ev = core.poll_event()
    assert ev is not None and ev.kind == _ffi.LH_EVENT_ACQUIRED and ev.lease_id == lease and ev.fencing_token == 1
    with pytest.raises(AttributeError):
        ev.kind = 0  # type: ignore[misc]  # an Event is immutable
    assert core.fencing_token(lease) == 1 and core.is_held(lease)
    assert core.valid_until(lease) == ev.valid_until_ns
    assert core.lease_state(lease) == _ffi.LH_STATE_HELD
    # answers for unknown or already answered ids are counted and ignored
    core.failed(999_999, _ffi.LH_FAILURE_TRANSPORT, "late")
    core.reply(req.id, 1)
    assert core.counters().backend_stale_replies == 2 and core.is_held(lease)
    with pytest.raises(UnknownLease):
        core.lease_state(lease + 12345)
    core.release(lease)
    (ev,) = core.drain()[0]
    assert ev.kind == _ffi.LH_EVENT_RELEASED and ev.reason_name == "none"
    assert len(_answer(core, ex)) == 1 and core.poll_event() is None  # no outcome asked for
    with pytest.raises(LeaseEnded):
        core.release(lease)
    # a reported release: the outcome follows the service's answer
    second = core.acquire("job", 3000)
    _answer(core, ex)
    assert core.poll_event() is not None
    assert core.release(second, report=True) == _ffi.LH_RELEASING_PENDING
    _answer(core, ex)
    kinds = [(e.kind, e.reason_name) for e in core.drain()[0]]
    assert kinds == [(_ffi.LH_EVENT_RELEASED, "none"), (_ffi.LH_EVENT_RELEASE_OUTCOME, "release_confirmed")]
    assert core.counters().releases_confirmed == 2 and core.backend_counters()["requests"] == 4
    core.close()
    core.close()
    with pytest.raises(ClientClosed):
        core.poll_event()


def test_core_refuses_answers_of_the_wrong_kind_and_unknown_enums() -> None:
    core = Core()  # the memory protocol: it takes values and messages, not HTTP replies
    core.acquire("w", 3000)
    (req,) = core.poll_io()
    for wrong in (
        lambda: core.http_reply(req.id, 200, b"{}"),
        lambda: core.stream_message(req.id, b"{}"),
        lambda: core.subscription(b"ch", True),
    ):
        with pytest.raises(InvalidArgument) as ei:
            wrong()
        assert ei.value.status_name == "LH_ERR_WRONG_ANSWER"
    for bad in (lambda: core.failed(req.id, 77, "x"), lambda: core.connection_event(9, _ffi.LH_CONNECTION_REOPENED)):
        with pytest.raises(InvalidArgument) as ei:
            bad()
        assert ei.value.status_name == "LH_ERR_INVALID_ENUM"
    assert core.lease_state(core.acquire("w2", 3000)) == _ffi.LH_STATE_ACQUIRING  # nothing changed
    core.close()


@pytest.mark.parametrize(
    "garbage",
    [Answer(b"\x00" * 5, 1, b""), Answer(b"", 3, b""), 2**70, [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]],
    ids=["short-values", "count-past-the-list", "int-over-64-bits", "too-deep"],
)
def test_a_malformed_answer_becomes_a_transport_failure_of_its_request(garbage: object) -> None:
    core = Core()
    lease = core.acquire("m", 3000, wait_ns=10**10)
    (req,) = core.poll_io()
    core.reply(req.id, garbage)  # refused by the core (LH_ERR_INVALID_REPLY): reported failed
    k = core.counters()
    assert k.backend_transport_failures == 1 and core.lease_state(lease) == _ffi.LH_STATE_ACQUIRING
    assert "unusable reply" in core.backend_last_error()
    core.close()


def test_core_decodes_every_kind_of_request() -> None:
    """Each backend's first requests, copied out of the core: the Redis wake channel's
    SUBSCRIBE on the notify connection, the SQL schema check's statements, an etcd POST."""
    redis = Core(backend=RedisOptions())
    (sub,) = redis.poll_io()
    assert (sub.kind, sub.connection) == (_ffi.LH_IO_COMMAND, _ffi.LH_CONNECTION_NOTIFY)
    assert sub.payload[0].upper() == b"SUBSCRIBE" and len(sub.payload) == 2
    sql = Core(backend=SqlOptions("sqlite"))
    sql.acquire("s", 3000)
    reqs = sql.poll_io()
    assert reqs and reqs[0].kind == _ffi.LH_IO_SQL and reqs[0].connection == _ffi.LH_CONNECTION_COMMANDS
    statements = reqs[0].payload.statements
    assert statements and all(isinstance(text, str) and text for text, _params in statements)
    etcd = Core(backend=EtcdOptions())
    etcd.acquire("e", 3000)
    (post,) = etcd.poll_io()
    assert post.kind == _ffi.LH_IO_HTTP and post.payload.method == "POST" and post.payload.path.startswith("/")
    assert post.payload.body.startswith(b"{") and post.payload.authorization == ""
    for c in (redis, sql, etcd):
        c.close()


@pytest.mark.parametrize("one_call", [True, False], ids=["lh_drain", "single-polls"])
def test_step_drains_what_poll_io_and_drain_drain(one_call: bool) -> None:
    """``Core.step`` (one ``lh_drain`` crossing, or the single polls on a library without
    it) takes the same requests, events and deadline as ``poll_io`` + ``drain``, more
    events than its buffer holds included."""
    clock = FakeClock()
    ex = MemoryExecutor(MemoryService(clock=clock))
    a, b = (Core(seed=b"d" * 32, clock=clock.monotonic_ns) for _ in range(2))
    if not one_call:
        b._c_drain = None
    assert b.step() == ([], [], None)

    def both(fn: Any) -> None:
        fn(a)
        fn(b)

    names = [f"n{i}" for i in range(11)]  # more grants than one lh_drain call takes
    both(lambda c: [c.acquire(n, 3000) for n in names])
    reqs = a.poll_io()
    events, dl = a.drain()
    assert b.step() == (reqs, events, dl) and len(reqs) == len(names) and dl is not None
    clock.advance(0.001)
    answers = [ex.command(r.payload) for r in reqs]
    both(lambda c: [c.reply(r.id, ans) for r, ans in zip(reqs, answers)])
    reqs = a.poll_io()
    events, dl = a.drain()
    got = b.step()
    assert got == (reqs, events, dl)
    assert [e.kind for e in got[1]] == [_ffi.LH_EVENT_ACQUIRED] * len(names)
    # A closed core says so through step() as through the single polls.
    b.close()
    with pytest.raises(ClientClosed):
        b.step()
    a.close()


def test_step_on_a_library_with_the_first_lh_drained() -> None:
    """A library whose ``lh_drained`` ends at ``deadline_ns`` (``LH_DRAINED_V1_SIZE``) writes
    that much back and no ``more_requests``: ``Core.step`` then calls again while a call took
    a request, and still takes every request, event and deadline ``poll_io`` + ``drain`` take."""
    clock = FakeClock()
    ex = MemoryExecutor(MemoryService(clock=clock))
    a, b = (Core(seed=b"v" * 32, clock=clock.monotonic_ns) for _ in range(2))
    # What a library built before ``more_requests`` sees: the first, shorter struct.
    b._drained.struct_size = _ffi.LH_DRAINED_V1_SIZE
    b._drained.more_requests = 0  # never written by such a library
    names = [f"v{i}" for i in range(11)]  # more requests and grants than one call takes
    leases = {c: [c.acquire(n, 3000) for n in names] for c in (a, b)}
    reqs = a.poll_io()
    events, dl = a.drain()
    assert b.step() == (reqs, events, dl) and len(reqs) == len(names) and dl is not None
    # The seam is real: the library wrote the first struct back, and nothing after it.
    assert (b._drained.struct_size, b._drained.more_requests) == (_ffi.LH_DRAINED_V1_SIZE, 0)
    clock.advance(0.001)
    answers = [ex.command(r.payload) for r in reqs]
    for c in (a, b):
        for r, ans in zip(reqs, answers):
            c.reply(r.id, ans)
    reqs = a.poll_io()
    events, dl = a.drain()
    got = b.step()
    assert got == (reqs, events, dl)
    assert [e.kind for e in got[1]] == [_ffi.LH_EVENT_ACQUIRED] * len(names)
    # Releases: a request each, all taken, then nothing is left.
    for c in (a, b):
        for lease in leases[c]:
            c.release(lease)
    reqs = a.poll_io()
    events, dl = a.drain()
    got = b.step()
    assert got == (reqs, events, dl) and len(got[0]) == len(names)
    assert b.poll_io() == [] and b.step()[0] == []
    a.close()
    b.close()


def test_step_on_a_library_with_the_first_lh_drained_stream_kind() -> None:
    """The same on the Redis stream kind, whose ``more_requests`` is exact (a library with the
    first struct takes one call more there): a drain of two requests, the streams' opens, then
    their handshakes, takes both."""
    clock = FakeClock()
    opts = RedisStreamOptions("redis://127.0.0.1:1")
    a, b = (Core(seed=b"w" * 32, clock=clock.monotonic_ns, backend=opts) for _ in range(2))
    b._drained.struct_size = _ffi.LH_DRAINED_V1_SIZE
    b._drained.more_requests = 0
    for c in (a, b):
        c.acquire("s", 3000)
    reqs = a.poll_io()
    events, dl = a.drain()
    assert b.step() == (reqs, events, dl)
    assert [r.kind for r in reqs] == [_ffi.LH_IO_OPEN] * 2
    for c in (a, b):
        for r in reqs:
            c.stream_opened(r.payload.stream)
    reqs = a.poll_io()
    events, dl = a.drain()
    assert b.step() == (reqs, events, dl)
    assert [r.kind for r in reqs] == [_ffi.LH_IO_WRITE] * 2
    assert (b._drained.struct_size, b._drained.more_requests) == (_ffi.LH_DRAINED_V1_SIZE, 0)
    a.close()
    b.close()


def test_stream_received_takes_bytes_like_data_and_refuses_text() -> None:
    """``stream_received`` passes its bytes without ctypes' argument checks: a bytes-like
    object reads as its bytes, a ``str`` or an ``int`` raises ``TypeError`` (never reaching
    the core as a pointer)."""
    clock = FakeClock()
    opts = RedisStreamOptions("redis://127.0.0.1:1")
    cores = [Core(seed=b"r" * 32, clock=clock.monotonic_ns, backend=opts) for _ in range(3)]
    for c in cores:
        c.acquire("s", 3000)
        for r in c.step()[0]:
            c.stream_opened(r.payload.stream)
        c.step()
        for bad in ("+OK\r\n", 5):
            with pytest.raises(TypeError):
                c.stream_received(1, bad)  # type: ignore[arg-type]
    reply = b"-ERR no\r\n"
    for c, data in zip(cores, (reply, bytearray(reply), memoryview(reply))):
        c.stream_received(1, data)  # type: ignore[arg-type]
    first = cores[0].step()
    assert first[0] or first[1]  # the reply did something
    assert all(c.step() == first for c in cores[1:])
    for c in cores:
        c.close()


@pytest.mark.parametrize("one_call", [True, False])
def test_step_with_bytes_feeds_and_drains_as_the_two_calls(one_call: bool) -> None:
    """``step(stream, data)`` feeds the bytes and drains in one crossing
    (``lh_io_received_drain``; without it, ``stream_received`` then ``step``): the same
    requests, events and deadline as the two calls on a twin core, for a reply split
    anywhere. Bytes the core refuses raise and are not taken: nothing is drained."""
    clock = FakeClock()
    opts = RedisStreamOptions("redis://127.0.0.1:1")
    a, b = (Core(seed=b"v" * 32, clock=clock.monotonic_ns, backend=opts) for _ in range(2))
    if not one_call:
        b._c_received_drain = None  # a library from before it
    for c in (a, b):
        c.acquire("s", 3000)
    opens = a.step()[0]
    assert b.step()[0] == opens and [r.kind for r in opens] == [_ffi.LH_IO_OPEN] * 2
    stream = opens[0].payload.stream
    with pytest.raises(CoreError):
        b.step(stream, b"+OK\r\n")  # before the stream opened: refused
    assert b.step() == a.step()  # and nothing was taken or drained
    for c in (a, b):
        c.stream_opened(stream)
    assert b.step() == a.step()  # the handshake
    hello = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n"
    for piece in (hello[:7], hello[7:]):
        a.stream_received(stream, piece)
        want = a.step()
        assert b.step(stream, piece) == want
    assert want[0], "the handshake's reply sent what waited for it"
    with pytest.raises(TypeError):
        b.step(stream, "+OK\r\n")  # type: ignore[arg-type]
    a.close()
    b.close()
    with pytest.raises(ClientClosed):
        b.step(stream, b"+OK\r\n")


def test_step_received_logs_refused_bytes_and_drains_all_the_same(caplog: pytest.LogCaptureFixture) -> None:
    """The clients' ``step_received``: bytes the core refuses are logged and the drain goes
    on (what the input caused before, or a timer, is not held back); a closed core raises."""
    clock = FakeClock()
    opts = RedisStreamOptions("redis://127.0.0.1:1")
    a, b = (Core(seed=b"q" * 32, clock=clock.monotonic_ns, backend=opts) for _ in range(2))
    for c in (a, b):
        c.acquire("s", 3000)
    opens = a.step()[0]
    stream = opens[0].payload.stream
    with caplog.at_level(logging.ERROR, logger="leasehold"):
        got = step_received(b, stream, b"+OK\r\n")  # before the stream opened: refused
    assert got == (opens, [], a.step()[2])  # the drain ran, as on the twin that took nothing
    assert [r.message for r in caplog.records] == ["leasehold: the core refused an input"]
    a.close()
    b.close()
    with pytest.raises(ClientClosed):
        step_received(b, stream, b"+OK\r\n")


def test_core_same_seed_same_tokens_reseed_differs() -> None:
    def first_token(c: Core) -> str:
        store = MemoryService()
        c.acquire("x", 3000)
        _answer(c, MemoryExecutor(store))
        rec = store.holder("x")
        assert rec is not None
        return rec.token

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
    """An executor handing back garbage instead of the service's answers: every one must
    become a transport error, never a grant."""

    def __init__(self, clock: FakeClock, answer: object) -> None:
        super().__init__(clock=clock)
        self.answer = answer
        self.calls = 0
        self.called = threading.Event()

    def command(self, argv: list[bytes]):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.called.set()
        if self.answer is None:
            return super().command(argv)
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [
        b"granted",
        7,
        ["OK", 1, 2],
        ValueError("ERR not today"),
        Answer(b"\x00" * 40, 2, b""),
        b"x" * (2 << 20),
        2**70,
        {"a": 1},
    ],
    ids=["bulk", "int", "array", "error", "malformed-values", "huge", "int-over-64-bits", "dict"],
)
def test_misbehaving_executor_never_grants_and_driver_survives(clock: FakeClock, answer: object) -> None:
    from core_helpers import Result

    from leasehold.testing import settle

    c = LockClient(_Odd(clock, answer), clock=clock)
    try:
        r = Result(lambda: c.acquire("odd", ttl=3, wait=1))
        assert c.service.called.wait(5)  # type: ignore[attr-defined]
        settle(clock, [c], seconds=4, step=0.1)
        with pytest.raises(LockTimeout):
            r.get()
        assert c.service.calls >= 1  # type: ignore[attr-defined]
        assert c.counters().grants == 0
        # The driver is alive: the service's own answers afterwards are granted.
        c.service.answer = None  # type: ignore[attr-defined]
        h = c.acquire("odd", ttl=3, wait=1)
        assert h.fencing_token == 1
    finally:
        c.close(timeout=0.2)

"""A thin, typed wrapper of one ``lh_client`` core handle.

:class:`Core` is **not** thread-safe (neither is the C handle): callers serialize every call
(``LockClient`` holds a mutex; ``AsyncLockClient`` only calls it from its event loop). Every
mutating call reads ``now`` from the clock given at construction (``time.monotonic_ns`` by
default). Everything polled is copied out of the borrowed C buffers at once, so an
:class:`Event` or an :class:`~leasehold._values.IoRequest` stays valid forever.

The methods follow the header's run loop: application inputs (``acquire``, ``release``,
``renew``, ``status_request``), the IO seam (``poll_io``, then one answer per request:
``reply``, ``sql_result``, ``http_reply``, ``stream_message``, ``failed``; notifications
and connection changes: ``message``, ``connection_event``), and the outputs (``drain``:
events and the next deadline).
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from . import _ffi, errors
from ._ffi import lib
from ._options import (
    BackendOptions,
    Config,
    EtcdOptions,
    MemoryOptions,
    RedisOptions,
    SqlOptions,
    _u64,
    backend_options,
)
from ._values import (
    REQUEST_HOT,
    Answer,
    Counters,
    LeaseInfo,
    SqlStatus,
    StatusAnswer,
    HostFact,
    HttpRequest,
    IoRequest,
    SqlRequest,
    decode_request,
    flatten_reply,
    _flatten_rows,
    flatten_rows,
    rows_error,
    sql_request,
    write_request,
)

__all__ = [
    "Answer",
    "BackendOptions",
    "ClockFn",
    "Config",
    "Core",
    "Counters",
    "EtcdOptions",
    "Event",
    "HostFact",
    "HttpRequest",
    "IoRequest",
    "LeaseInfo",
    "MemoryOptions",
    "RedisOptions",
    "SqlOptions",
    "SqlRequest",
    "SqlStatus",
    "StatusAnswer",
    "dispatch_all",
    "flatten_reply",
    "flatten_rows",
]

ClockFn = Callable[[], int]
"""A monotonic clock in integer nanoseconds."""


class Event(NamedTuple):
    """One polled event for the application (``lh_event``; immutable, cheap to build).
    Fields that do not apply to the kind are 0."""

    kind: int
    reason: int = 0
    lease_id: int = 0
    fencing_token: int = 0
    valid_until_ns: int = 0

    @property
    def reason_name(self) -> str:
        return _ffi.REASON_NAMES.get(self.reason, str(self.reason))


_EVENT_LAYOUT = struct.Struct("@IIQQQ")
if _EVENT_LAYOUT.size != ctypes.sizeof(_ffi.lh_event):  # pragma: no cover - exotic ABI
    raise errors.LibraryError(
        f"lh_event layout mismatch: struct {_EVENT_LAYOUT.size} bytes, ctypes {ctypes.sizeof(_ffi.lh_event)}"
    )
_new_event = tuple.__new__
_WRITE, _SQL = _ffi.LH_IO_WRITE, _ffi.LH_IO_SQL
_EVENT_SIZE = _EVENT_LAYOUT.size
_DRAINED_LAYOUT = struct.Struct("@IIIIQII")  # lh_drained
_DRAINED_V1_SIZE = _ffi.LH_DRAINED_V1_SIZE  # (a library whose lh_drained ends at deadline_ns)
if _DRAINED_LAYOUT.size != ctypes.sizeof(_ffi.lh_drained):  # pragma: no cover - exotic ABI
    raise errors.LibraryError(
        f"lh_drained layout mismatch: struct {_DRAINED_LAYOUT.size} bytes, ctypes {ctypes.sizeof(_ffi.lh_drained)}"
    )
_unpack_drained = _DRAINED_LAYOUT.unpack_from
_unpack_hot = REQUEST_HOT.unpack_from
# Events one lh_drain call takes (a drain holds one or two; more take another call).
_STEP_EVENTS = 8
_string_at = ctypes.string_at
_check = _ffi.check


def _as_u8p(data: bytes) -> "ctypes._Pointer[ctypes.c_uint8]":
    return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))


def _encode_name(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise ValueError(f"lock name is not valid UTF-8: {e}") from None


def _bounded(message: str | bytes) -> bytes:
    raw = message if isinstance(message, bytes) else message.encode("utf-8", "replace")
    return raw[: _ffi.LH_MAX_REPLY_DATA]


_NO_DEADLINE = _ffi.LH_NO_DEADLINE
_U64_MAX = _ffi.U64_MAX
_REENTRANT = _ffi.LH_ACQUIRE_REENTRANT
_NO_AUTO_RENEW = _ffi.LH_ACQUIRE_NO_AUTO_RENEW
_TRANSPORT = _ffi.LH_FAILURE_TRANSPORT
_INVALID_REPLY = _ffi.LH_ERR_INVALID_REPLY
_PROTOCOLS = {
    _ffi.LH_BACKEND_MEMORY: "memory",
    _ffi.LH_BACKEND_REDIS: "redis",
    _ffi.LH_BACKEND_REDIS_STREAM: "redis",
    _ffi.LH_BACKEND_SQLITE: "sql",
    _ffi.LH_BACKEND_POSTGRES: "sql",
    _ffi.LH_BACKEND_ETCD: "etcd",
}


def _last_error(p: Any) -> str:
    raw = lib.lh_client_last_error(p)
    return raw.decode("utf-8", "replace") if raw else ""


@dataclass
class _Handle:
    ptr: Any = field(default=None)  # ctypes pointer to lh_client, None once freed


class Core:
    """One core handle with its backend's protocol. Not thread-safe: serialize calls.

    :param config: core configuration (defaults from the core when omitted)
    :param seed: at least 16 bytes; ``os.urandom(32)`` when omitted
    :param clock: monotonic nanoseconds; ``time.monotonic_ns`` when omitted
    :param backend: the backend's options (:class:`MemoryOptions`, the default,
        :class:`RedisOptions`, :class:`SqlOptions`, :class:`EtcdOptions`); ``redis=`` is its
        first name
    """

    def __init__(
        self,
        config: Config | None = None,
        seed: bytes | None = None,
        clock: ClockFn | None = None,
        redis: RedisOptions | None = None,
        backend: BackendOptions | None = None,
    ) -> None:
        self._clock: ClockFn = clock or time.monotonic_ns
        if redis is not None and backend is not None:
            raise ValueError("give redis= or backend=, not both")
        options = backend_options(backend if backend is not None else redis)
        cfg = (config or Config()).to_c()
        bopts = options.to_c()
        seed = os.urandom(32) if seed is None else seed
        if not isinstance(seed, (bytes, bytearray)):
            raise TypeError("seed must be bytes")
        seed = bytes(seed)
        out = _ffi.lh_client_p()
        try:
            lib.lh_client_new(ctypes.byref(cfg), ctypes.byref(bopts), _as_u8p(seed), len(seed), ctypes.byref(out))
        except errors.CoreError as e:
            # No handle holds a detail yet: the core says why on the same arguments.
            why = _ffi.client_new_reason(cfg, bopts, _as_u8p(seed), len(seed))
            if not why:
                raise
            raise _ffi.make_error(e.status, why, "lh_client_new") from None
        self.protocol: str = _PROTOCOLS[int(bopts.kind)]
        self._h = _Handle(out)
        # Reused out-params (the handle is not thread-safe anyway): no allocation per poll.
        self._ev = _ffi.lh_event()
        self._ev_ref = ctypes.byref(self._ev)
        self._unpack_ev = _EVENT_LAYOUT.unpack_from
        self._req = _ffi.lh_io_request()
        self._req_ref = ctypes.byref(self._req)
        self._deadline = ctypes.c_uint64()
        self._deadline_ref = ctypes.byref(self._deadline)
        # Hot calls without errcheck (the status is tested inline; see _ffi.unchecked).
        self._poll_event = _ffi.unchecked("lh_poll_event", pointers_only=True)
        self._poll_io = _ffi.unchecked("lh_io_poll", pointers_only=True)
        self._poll_timeout = _ffi.unchecked("lh_poll_timeout", pointers_only=True)
        # lh_drain: the drain after an input in one crossing (None: a library from before it).
        self._c_drain = _ffi.unchecked("lh_drain", ctypes_args=True) if hasattr(lib, "lh_drain") else None
        # lh_io_received_drain: bytes read and the first drain call in one crossing (None: a
        # library from before it).
        self._c_received_drain: Any = (
            _ffi.unchecked("lh_io_received_drain", ctypes_args=True)
            if self._c_drain is not None and hasattr(lib, "lh_io_received_drain")
            else None
        )
        self._evs = (_ffi.lh_event * _STEP_EVENTS)()
        self._evs_ref = ctypes.byref(self._evs)
        self._evs_cap = ctypes.c_size_t(_STEP_EVENTS)
        self._drained = _ffi.lh_drained(struct_size=ctypes.sizeof(_ffi.lh_drained))
        self._drained_ref = ctypes.byref(self._drained)
        self._drain_args: tuple[Any, ...] = (None,)  # lh_drain's arguments, made at the first step()
        # The hottest inputs take ctypes objects reused for their integer arguments: ctypes
        # converts an argument through ``argtypes`` at several times the cost of the call.
        self._c_acquire = _ffi.unchecked("lh_acquire", ctypes_args=True)
        self._c_release = _ffi.unchecked("lh_release", ctypes_args=True)
        self._c_reply = _ffi.unchecked("lh_io_reply", ctypes_args=True)
        self._arg_now, self._arg_id = ctypes.c_uint64(), ctypes.c_uint64()
        self._arg_n, self._arg_len = ctypes.c_size_t(), ctypes.c_size_t()
        self._c_received = _ffi.unchecked("lh_io_received", ctypes_args=True)
        self._arg_stream = ctypes.c_uint64()
        self._opts = _ffi.lh_acquire_options()
        lib.lh_acquire_options_default(ctypes.byref(self._opts))
        self._opts.struct_size = ctypes.sizeof(_ffi.lh_acquire_options)
        self._opts_ref = ctypes.byref(self._opts)
        self._lease = ctypes.c_uint64()
        self._lease_ref = ctypes.byref(self._lease)
        self._releasing = ctypes.c_uint32()
        self._releasing_ref = ctypes.byref(self._releasing)
        self.notifications = bool(cfg.notifications)
        self.request_timeout_ns = int(cfg.request_timeout_ns)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._h.ptr is None

    def _p(self) -> Any:
        # The hot inputs test ``self._h.ptr`` inline and call this only to raise: a frame per
        # crossing is a measurable part of a Python lock cycle.
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        return p

    def close(self) -> None:
        """Free the handle (idempotent)."""
        p, self._h.ptr = self._h.ptr, None
        if p is not None:
            lib.lh_client_free(p)

    def __del__(self) -> None:  # safety net; close() is the way
        try:
            self.close()
        except Exception:
            pass

    def now(self) -> int:
        """The clock's current reading (ns)."""
        return int(self._clock())

    def reseed(self, seed: bytes | None = None) -> None:
        """Reseed the token/jitter generator (call in a forked child)."""
        seed = os.urandom(32) if seed is None else bytes(seed)
        lib.lh_client_reseed(self._p(), _as_u8p(seed), len(seed))

    # -- application inputs -----------------------------------------------------------------------
    def acquire(
        self, name: str, ttl_ms: int, wait_ns: int = 0, reentrant: bool = False, auto_renew: bool = True
    ) -> int:
        """Start acquiring ``name``; returns the new (or, reentrant, the existing) lease id."""
        raw = name.encode() if type(name) is str and name.isascii() else _encode_name(name)
        opts = self._opts  # reused: the core never retains input buffers
        opts.flags = (_REENTRANT if reentrant else 0) | (0 if auto_renew else _NO_AUTO_RENEW)
        opts.ttl_ms = ttl_ms if type(ttl_ms) is int and 0 <= ttl_ms <= _U64_MAX else _u64(ttl_ms, "ttl_ms")
        opts.wait_ns = wait_ns if type(wait_ns) is int and 0 <= wait_ns <= _U64_MAX else _u64(wait_ns, "wait_ns")
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        now, size = self._arg_now, self._arg_len
        now.value, size.value = int(self._clock()), len(raw)
        st = self._c_acquire(p, now, raw, size, self._opts_ref, self._lease_ref)
        if st:
            _check(st, p, "lh_acquire")
        lease: int = self._lease.value
        return lease

    def release(self, lease: int, report: bool = False) -> int | None:
        """Release ``lease``. With ``report``, return what happened (an ``LH_RELEASING_*``
        value; after ``LH_RELEASING_PENDING`` a RELEASE_OUTCOME event follows)."""
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        if not (type(lease) is int and 0 <= lease <= _U64_MAX):
            lease = _u64(lease, "lease")
        now, arg = self._arg_now, self._arg_id
        now.value, arg.value = int(self._clock()), lease
        st = self._c_release(p, now, arg, self._releasing_ref if report else None)
        if st:
            _check(st, p, "lh_release")
        return int(self._releasing.value) if report else None

    def release_reported(self, lease: int) -> int:
        """``release(lease, report=True)`` (spelled out: one frame less per release)."""
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        if not (type(lease) is int and 0 <= lease <= _U64_MAX):
            lease = _u64(lease, "lease")
        now, arg = self._arg_now, self._arg_id
        now.value, arg.value = int(self._clock()), lease
        st = self._c_release(p, now, arg, self._releasing_ref)
        if st:
            _check(st, p, "lh_release")
        return int(self._releasing.value)

    def renew(self, lease: int) -> None:
        """Renew ``lease`` now (or join the renewal in flight); RENEWED or LOST follows."""
        lib.lh_renew(self._p(), int(self._clock()), _u64(lease, "lease"))

    def timeout(self) -> None:
        lib.lh_timeout(self._p(), self.now())

    def status_request(self, name: str) -> int:
        """Queue a status query for ``name`` on the backend's protocol; its id (see
        :meth:`poll_status`)."""
        raw = _encode_name(name)
        out = ctypes.c_uint64()
        lib.lh_status_request(self._p(), int(self._clock()), raw, len(raw), ctypes.byref(out))
        return int(out.value)

    def poll_status(self) -> tuple[int, StatusAnswer] | None:
        """The next answered status query as ``(id, status)``, or ``None``."""
        st = _ffi.lh_lock_status()
        st.struct_size = ctypes.sizeof(_ffi.lh_lock_status)
        lib.lh_poll_status(self._p(), ctypes.byref(st))
        if st.id == 0:
            return None
        host = _string_at(st.holder_host, st.holder_host_len).decode("utf-8", "replace") if st.holder_host_len else ""
        err = _string_at(st.error, st.error_len).decode("utf-8", "replace") if st.error_len else ""
        return int(st.id), StatusAnswer(
            ok=bool(st.ok),
            held=bool(st.held),
            fencing_token=int(st.fencing_token),
            remaining_ttl_ms=int(st.remaining_ttl_ms),
            last_fencing_token=int(st.last_fencing_token),
            holder_pid=int(st.holder_pid),
            held_for_ms=int(st.held_for_ms),
            holder_host=host,
            error=err,
        )

    # The first names, from when only SQL handles answered status queries.
    sql_status_request = status_request
    sql_poll_status = poll_status

    # -- the IO seam: requests -----------------------------------------------------------------
    def poll_io(self) -> list[IoRequest]:
        """Every pending request, copied, in order."""
        p = self._p()
        poll, ref, buf = self._poll_io, self._req_ref, self._req
        reqs: list[IoRequest] = []
        while True:
            st = poll(p, ref)
            if st:
                _check(st, p, "lh_io_poll")
            if not buf.kind:  # LH_IO_NONE: the common last poll, without decoding
                return reqs
            req = decode_request(buf)
            if req is None:
                return reqs
            reqs.append(req)

    # -- the IO seam: answers ------------------------------------------------------------------
    def reply(self, request_id: int, reply: Any) -> None:
        """The answer to a COMMAND (see :func:`~leasehold._values.flatten_reply`); one the
        core refuses as malformed is reported as a transport failure of the request."""
        p, now = self._p(), int(self._clock())
        try:
            values, n, data = flatten_reply(reply)
        except (struct.error, OverflowError) as e:  # an integer outside 64 bits
            self._failed(p, now, request_id, _TRANSPORT, f"unusable reply: {e}")
            return
        st = self._reply(p, now, request_id, values, n, data)
        if st == _INVALID_REPLY:
            self._failed(p, now, request_id, _TRANSPORT, f"unusable reply: {_ffi.make_error(st, _last_error(p))}")
        elif st:
            _check(st, p, "lh_io_reply")

    def _reply(self, p: Any, now: int, request_id: int, values: bytes, n: int, data: bytes) -> int:
        """``lh_io_reply`` with the reused argument objects; its status."""
        a_now, a_id, a_n, a_len = self._arg_now, self._arg_id, self._arg_n, self._arg_len
        a_now.value, a_id.value, a_n.value, a_len.value = now, request_id, n, len(data)
        st: int = self._c_reply(p, a_now, a_id, values, a_n, data, a_len)
        return st

    def sql_result(self, request_id: int, results: list[list[Any]]) -> None:
        """Every statement's rows (see :func:`~leasehold._values.flatten_rows`); rows the
        core refuses as malformed are reported as a transport failure of the request."""
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        now = int(self._clock())
        try:
            values, n, data = _flatten_rows(results)  # flatten_rows without its frame
        except (ValueError, struct.error, OverflowError) as e:
            self._failed(p, now, request_id, _TRANSPORT, f"malformed rows: {rows_error(results, e)}")
            return
        a_now, a_id, a_n, a_len = self._arg_now, self._arg_id, self._arg_n, self._arg_len
        a_now.value, a_id.value, a_n.value, a_len.value = now, request_id, n, len(data)
        st = self._c_reply(p, a_now, a_id, values, a_n, data, a_len)
        if st == _INVALID_REPLY:
            why = _ffi.make_error(st, _last_error(p), "lh_io_reply")
            self._failed(p, now, request_id, _TRANSPORT, f"malformed rows: {why}")
        elif st:
            _check(st, p, "lh_io_reply")

    def http_reply(self, request_id: int, status: int, body: bytes) -> None:
        """A unary HTTP reply; a status or body the core cannot take is a failure of the
        request."""
        p, now = self._p(), int(self._clock())
        try:
            lib.lh_io_http_reply(p, now, request_id, status, body or None, len(body))
        except errors.InvalidArgument as e:
            if e.status != _INVALID_REPLY:
                raise
            self._failed(p, now, request_id, _TRANSPORT, f"unusable reply: {e}")

    def stream_message(self, request_id: int, message: bytes) -> None:
        """One message of HTTP watch ``request_id``; one the core cannot take ends it."""
        p, now = self._p(), int(self._clock())
        try:
            lib.lh_io_stream_message(p, now, request_id, message, len(message))
        except errors.InvalidArgument as e:
            if e.status != _INVALID_REPLY:
                raise
            self._failed(p, now, request_id, _TRANSPORT, f"unusable watch message: {e}")

    http_stream_message = stream_message

    def failed(self, request_id: int, kind: int = _TRANSPORT, message: str | bytes = b"") -> None:
        """Request ``request_id`` got no answer (``LH_FAILURE_TRANSPORT``) or the database
        refused it (``LH_FAILURE_DATABASE``); ``message`` says what happened."""
        self._failed(self._p(), int(self._clock()), request_id, kind, message)

    @staticmethod
    def _failed(p: Any, now: int, request_id: int, kind: int, message: str | bytes) -> None:
        msg = _bounded(message)
        lib.lh_io_failed(p, now, request_id, kind, msg or None, len(msg))

    def sql_failed(self, request_id: int, kind: int, message: str | bytes) -> None:
        self.failed(request_id, kind, message)

    def http_failed(self, request_id: int, message: str | bytes) -> None:
        self.failed(request_id, _TRANSPORT, message)

    def request_failed(self, request_id: int, message: str | bytes = b"") -> None:
        self.failed(request_id, _TRANSPORT, message)

    # -- the IO seam: notifications and connections ----------------------------------------------
    def message(self, channel: str | bytes, payload: str | bytes = b"") -> None:
        """A notification that arrived on a connection (a Redis pub/sub message, a
        PostgreSQL NOTIFY, a memory-service release: channel = the name)."""
        ch, pl = _bounded(channel), _bounded(payload)
        lib.lh_io_message(self._p(), int(self._clock()), ch, len(ch), pl or None, len(pl))

    pubsub_message = message
    sql_notification = message

    def connection_event(self, connection: int, event: int, channel: bytes = b"") -> None:
        """Something happened to ``connection`` (``LH_CONNECTION_REOPENED``, or a
        subscription of ``channel`` took effect or ended)."""
        ch = _bounded(channel)
        lib.lh_io_connection(self._p(), int(self._clock()), connection, event, ch or None, len(ch))

    def subscription(self, channel: bytes, subscribed: bool) -> None:
        """A subscription of ``channel`` took effect or ended (on the notify connection)."""
        ev = _ffi.LH_CONNECTION_SUBSCRIBED if subscribed else _ffi.LH_CONNECTION_UNSUBSCRIBED
        self.connection_event(_ffi.LH_CONNECTION_NOTIFY, ev, channel)

    def reopened(self, connection: int = _ffi.LH_CONNECTION_COMMANDS) -> None:
        """``connection`` was opened anew (what lived on the old one is set up again)."""
        self.connection_event(connection, _ffi.LH_CONNECTION_REOPENED)

    sql_connection_reset = reopened

    # -- the IO seam: streams (the core owns the wire) --------------------------------------------
    def stream_opened(self, stream: int) -> None:
        """Stream ``stream`` of an ``LH_IO_OPEN`` is connected."""
        lib.lh_io_opened(self._p(), int(self._clock()), stream)

    def stream_received(self, stream: int, data: bytes) -> None:
        """Bytes read on ``stream`` (any split; at most ``LH_MAX_REPLY_DATA`` per call)."""
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        st = self._c_received(p, *self._received_args(stream, data))
        if st:
            _check(st, p, "lh_io_received")

    def _received_args(self, stream: int, data: bytes) -> tuple[Any, Any, bytes, Any]:
        """``lh_io_received``'s arguments after the handle, in the reused ctypes values (no
        argtypes check ``data``: a ``str`` would pass as ``wchar_t*``, so it is refused here)."""
        if type(data) is not bytes:
            data = memoryview(data).tobytes()
        now, arg, size = self._arg_now, self._arg_stream, self._arg_len
        now.value, arg.value, size.value = int(self._clock()), stream, len(data)
        return now, arg, data, size

    def stream_closed(self, stream: int, message: str | bytes = b"") -> None:
        """``stream`` ended or never opened; ``message`` says why."""
        msg = _bounded(message)
        lib.lh_io_closed(self._p(), int(self._clock()), stream, msg or None, len(msg))

    def close_backend(self) -> None:
        """The client is closing (etcd: queues the revoke of its pooled leases; the
        requests follow)."""
        lib.lh_io_close(self._p(), int(self._clock()))

    etcd_close = close_backend

    def backend_last_error(self) -> str:
        """The last error the backend reported or the protocol found in an answer (a refused
        statement, an error reply, a malformed body); ``""`` if none."""
        raw = lib.lh_backend_last_error(self._p())
        return raw.decode("utf-8", "replace") if raw else ""

    def backend_counters(self) -> dict[str, int]:
        """The backend protocol's counters by their short names (see
        :meth:`Counters.backend`)."""
        return self.counters().backend(self.protocol)

    # -- outputs ---------------------------------------------------------------------------------------
    def poll_event(self) -> Event | None:
        """The next event, copied; ``None`` when drained."""
        p = self._p()
        st = self._poll_event(p, self._ev_ref)
        if st:
            _check(st, p, "lh_poll_event")
        fields = self._unpack_ev(self._ev)
        return None if fields[0] == 0 else _new_event(Event, fields)

    def poll_timeout(self) -> int | None:
        """The next deadline (ns on this core's clock), ``None`` when there is none."""
        p = self._p()
        st = self._poll_timeout(p, self._deadline_ref)
        if st:
            _check(st, p, "lh_poll_timeout")
        v: int = self._deadline.value
        return None if v == _NO_DEADLINE else v

    def drain(self) -> tuple[list[Event], int | None]:
        """Every pending event in order, then the next deadline: the host's drain after an
        input (``poll_event`` until none is left, then ``poll_timeout``) in one call."""
        p = self._p()
        poll, ref, buf, unpack = self._poll_event, self._ev_ref, self._ev, self._unpack_ev
        events: list[Event] = []
        while True:
            st = poll(p, ref)
            if st:
                _check(st, p, "lh_poll_event")
            fields = unpack(buf)
            if fields[0] == 0:  # LH_EVENT_NONE
                break
            events.append(_new_event(Event, fields))
        st = self._poll_timeout(p, self._deadline_ref)
        if st:
            _check(st, p, "lh_poll_timeout")
        v: int = self._deadline.value
        return events, None if v == _NO_DEADLINE else v

    def step(self, stream: int = 0, data: bytes | None = None) -> tuple[list[IoRequest], list[Event], int | None]:
        """The whole drain after an input: every pending request, every event and the next
        deadline (``poll_io`` then ``drain``), in one crossing of the ABI when the library
        has ``lh_drain``. With ``data``, the input is those bytes read on ``stream``
        (:meth:`stream_received`), fed in the drain's first crossing when the library has
        ``lh_io_received_drain``; bytes the core refuses raise before anything is drained."""
        if data is not None and self._c_received_drain is None:  # (a library from before it)
            self.stream_received(stream, data)
            data = None
        fn = self._c_drain
        if fn is None:
            return self._step_polls()
        p = self._h.ptr
        if p is None:
            self._p()  # raises ClientClosed
        d, r = self._drained, self._req
        args = self._drain_args
        if args[0] is not p:
            args = self._drain_args = (p, self._req_ref, self._evs_ref, self._evs_cap, self._drained_ref)
        reqs: list[IoRequest] = []
        events: list[Event] = []
        if data is None:
            st = fn(*args)
            if st:
                _check(st, p, "lh_drain")
        else:
            st = self._c_received_drain(p, *self._received_args(stream, data), *args[1:])
            if st:
                _check(st, p, "lh_io_received_drain")
        while True:
            size, took, n, more, dl, more_reqs, _ = _unpack_drained(d)  # one read of the struct
            if took:
                rid, kind, at, n_data, to = _unpack_hot(r)  # one read of the struct
                if kind == _WRITE:  # the byte path's request, from the fields read above
                    reqs.append(write_request(rid, to, at, n_data))
                elif kind == _SQL:  # decode_request's SQL case, one frame less
                    reqs.append(sql_request(r))
                else:
                    req = decode_request(r)
                    if req is not None:
                        reqs.append(req)
            if n:
                evs, unpack_ev = self._evs, self._unpack_ev
                if n == 1:
                    events.append(_new_event(Event, unpack_ev(evs)))
                else:
                    for i in range(n):
                        events.append(_new_event(Event, unpack_ev(evs, i * _EVENT_SIZE)))
            if not (more or (more_reqs if size > _DRAINED_V1_SIZE else took)):
                return reqs, events, None if dl == _NO_DEADLINE else dl
            st = fn(*args)
            if st:
                _check(st, p, "lh_drain")

    def _step_polls(self) -> tuple[list[IoRequest], list[Event], int | None]:
        """:meth:`step` on a library without ``lh_drain``."""
        reqs = self.poll_io()
        events, dl = self.drain()
        return reqs, events, dl

    # -- getters -------------------------------------------------------------------------------------------
    def lease_state(self, lease: int) -> int:
        v = ctypes.c_uint32()
        lib.lh_lease_state(self._p(), _u64(lease, "lease"), ctypes.byref(v))
        return int(v.value)

    def lease_info(self, lease: int) -> LeaseInfo:
        info = _ffi.lh_lease_info()
        info.struct_size = ctypes.sizeof(_ffi.lh_lease_info)
        lib.lh_lease_info_get(self._p(), _u64(lease, "lease"), ctypes.byref(info))
        has = bool(info.has_token)
        return LeaseInfo(
            state=int(info.state),
            holders=int(info.holders),
            fencing_token=int(info.fencing_token) if has else None,
            valid_until_ns=int(info.valid_until_ns) if has else None,
        )

    def fencing_token(self, lease: int) -> int:
        v = ctypes.c_uint64()
        lib.lh_fencing_token(self._p(), _u64(lease, "lease"), ctypes.byref(v))
        return int(v.value)

    def valid_until(self, lease: int) -> int:
        v = ctypes.c_uint64()
        lib.lh_valid_until(self._p(), _u64(lease, "lease"), ctypes.byref(v))
        return int(v.value)

    def is_held(self, lease: int) -> bool:
        v = ctypes.c_bool()
        lib.lh_is_held(self._p(), _u64(lease, "lease"), self.now(), ctypes.byref(v))
        return bool(v.value)

    def counters(self) -> Counters:
        c = _ffi.lh_counters()
        c.struct_size = ctypes.sizeof(_ffi.lh_counters)
        lib.lh_counters_get(self._p(), ctypes.byref(c))
        return Counters(**{f: int(getattr(c, f)) for f in _ffi.ALL_COUNTER_FIELDS})

    def debug_panic(self) -> None:
        """Test hook: make the core panic inside the ABI boundary (poisons the handle).
        Needs a library built with the ``testing`` feature (else :class:`~leasehold.errors.LibraryError`)."""
        _ffi.hook("lh_client_debug_panic")(self._p())


def dispatch_all(events: list[Event], dispatch: Callable[[Event], None]) -> None:
    """Hand each drained event to ``dispatch``; one that raises is logged and the rest still
    go (shared by LockClient and AsyncLockClient; dispatching never calls back into the core)."""
    for ev in events:
        try:
            dispatch(ev)
        except Exception:
            logging.getLogger("leasehold").exception("leasehold: failed to dispatch %r", ev)

"""A thin, typed wrapper of one ``lh_client`` core handle.

:class:`Core` is **not** thread-safe (neither is the C handle): callers serialize every call
(``LockClient`` holds a mutex; ``AsyncLockClient`` only calls it from its event loop). Every
mutating call reads ``now`` from the clock given at construction (``time.monotonic_ns`` by
default). Outputs are copied out of the borrowed C buffers immediately, so an :class:`Output`
stays valid forever.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from . import _ffi, errors
from ._ffi import lib

__all__ = [
    "Config",
    "Core",
    "Output",
    "LeaseInfo",
    "Counters",
    "ClockFn",
    "RedisOptions",
    "SqlOptions",
    "EtcdOptions",
    "HostFact",
    "SqlRequest",
    "HttpRequest",
    "SqlStatus",
    "StatusAnswer",
    "flatten_reply",
    "flatten_rows",
]

ClockFn = Callable[[], int]
"""A monotonic clock in integer nanoseconds."""


@dataclass(frozen=True)
class Config:
    """Core configuration. ``None`` fields keep the core's defaults (``lh_config_default``).

    Times are nanoseconds, TTLs milliseconds, ratios parts per million, as in the core.
    ``notifications`` is normally taken from the service (``LockService.notifications``).
    """

    drift_ppm: int | None = None
    drift_fixed_ns: int | None = None
    renew_jitter_ppm: int | None = None
    request_timeout_ns: int | None = None
    fail_budget: int | None = None
    backoff_base_ns: int | None = None
    backoff_cap_ns: int | None = None
    max_ttl_ms: int | None = None
    max_leases: int | None = None
    notifications: bool | None = None

    def to_c(self) -> _ffi.lh_config:
        """The C struct with defaults filled in and overrides applied."""
        c = _ffi.lh_config()
        lib.lh_config_default(ctypes.byref(c))
        c.struct_size = ctypes.sizeof(_ffi.lh_config)
        for name in (
            "drift_ppm",
            "drift_fixed_ns",
            "renew_jitter_ppm",
            "request_timeout_ns",
            "fail_budget",
            "backoff_base_ns",
            "backoff_cap_ns",
            "max_ttl_ms",
            "max_leases",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{name} must be an int, not {type(value).__name__}")
            limit = 2 ** (8 * getattr(_ffi.lh_config, name).size) - 1
            if not 0 <= value <= limit:
                raise ValueError(f"Config.{name} must be in 0..{limit}, got {value}")
            setattr(c, name, value)
        if self.notifications is not None:
            c.notifications = 1 if self.notifications else 0
        return c

    @staticmethod
    def defaults() -> dict[str, int]:
        """The core's default values (from ``lh_config_default``)."""
        c = _ffi.lh_config()
        lib.lh_config_default(ctypes.byref(c))
        names = [f[0] for f in _ffi.lh_config._fields_]
        return {n: int(getattr(c, n)) for n in names if n != "struct_size"}


@dataclass(frozen=True)
class RedisOptions:
    """Options of the core's Redis protocol (``lh_redis_options``); ``None`` keeps the core's
    default. Milliseconds."""

    standby_delay_ms: int | None = None
    key_keep_ms: int | None = None
    queue_max_age_ms: int | None = None
    idle_recheck_ms: int | None = None
    #: Redis Cluster: wake-ups on one shard channel per name (SPUBLISH / SSUBSCRIBE).
    sharded_wake: bool = False

    def to_c(self) -> _ffi.lh_redis_options:
        c = _ffi.lh_redis_options()
        lib.lh_redis_options_default(ctypes.byref(c))
        c.struct_size = ctypes.sizeof(_ffi.lh_redis_options)
        for name in ("standby_delay_ms", "key_keep_ms", "queue_max_age_ms", "idle_recheck_ms"):
            value = getattr(self, name)
            if value is not None:
                setattr(c, name, _u64(value, f"RedisOptions.{name}"))
        c.sharded_wake = 1 if self.sharded_wake else 0
        return c


@dataclass(frozen=True)
class SqlOptions:
    """Options of the core's SQL protocol (``lh_sql_options``): the dialect (``"sqlite"`` or
    ``"postgresql"``), for SQLite the busy timeout in ms (``None``: the core's 5000), for
    PostgreSQL ``asynchronous_commit`` (acquire, renew and release commit without waiting for
    the WAL flush; docs/backends.md)."""

    dialect: str = "sqlite"
    busy_timeout_ms: int | None = None
    asynchronous_commit: bool = False

    def to_c(self) -> _ffi.lh_sql_options:
        c = _ffi.lh_sql_options()
        lib.lh_sql_options_default(ctypes.byref(c))
        c.struct_size = ctypes.sizeof(_ffi.lh_sql_options)
        dialects = {"sqlite": _ffi.LH_DIALECT_SQLITE, "postgresql": _ffi.LH_DIALECT_POSTGRES}
        if self.dialect not in dialects:
            raise ValueError(f"SqlOptions.dialect must be 'sqlite' or 'postgresql', not {self.dialect!r}")
        c.dialect = dialects[self.dialect]
        if self.busy_timeout_ms is not None:
            c.busy_timeout_ms = _u64(self.busy_timeout_ms, "SqlOptions.busy_timeout_ms")
        c.asynchronous_commit = 1 if self.asynchronous_commit else 0
        return c


@dataclass(frozen=True)
class EtcdOptions:
    """Options of the core's etcd protocol (``lh_etcd_options``): a user and password make
    the core authenticate first and send its token with every request."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def to_c(self) -> tuple[_ffi.lh_etcd_options, tuple[bytes, bytes]]:
        c = _ffi.lh_etcd_options()
        lib.lh_etcd_options_default(ctypes.byref(c))
        c.struct_size = ctypes.sizeof(_ffi.lh_etcd_options)
        user = (self.user or "").encode("utf-8")
        password = (self.password or "").encode("utf-8")
        if user:
            c.user, c.user_len = user, len(user)
            c.password, c.password_len = (password or None), len(password)
        return c, (user, password)  # the bytes stay alive as long as the struct is used


class HostFact(enum.IntEnum):
    """A parameter the executor binds from the host (read once per request): the SQL
    protocol's ``LH_PARAM_HOST_*``."""

    MONOTONIC_NS = _ffi.LH_PARAM_HOST_MONOTONIC_NS
    WALL_US = _ffi.LH_PARAM_HOST_WALL_US
    BOOT_ID = _ffi.LH_PARAM_HOST_BOOT_ID
    PID = _ffi.LH_PARAM_HOST_PID
    HOST_NAME = _ffi.LH_PARAM_HOST_NAME


class SqlRequest(NamedTuple):
    """One SQL request, copied out of the core: run ``statements`` (SQL text, parameters:
    ``None``, ``int``, ``str``, ``bytes`` or a :class:`HostFact`) in order on ``connection``
    (``LH_SQL_CONNECTION_COMMANDS`` or ``_LISTENER``), in autocommit mode."""

    connection: int
    statements: list[tuple[str, list[Any]]]


class HttpRequest(NamedTuple):
    """One etcd gateway request, copied out of the core (``kind`` is ``LH_HTTP_*``)."""

    kind: int
    method: str
    path: str
    body: bytes
    authorization: str


@dataclass(frozen=True)
class StatusAnswer:
    """What the backend said about one name (``lh_poll_status``); advisory."""

    ok: bool
    held: bool
    fencing_token: int
    remaining_ttl_ms: int
    last_fencing_token: int
    holder_pid: int
    held_for_ms: int
    holder_host: str
    error: str


SqlStatus = StatusAnswer  # its first name, from when only SQL answered status queries


# One lh_value: u32 kind, u32 reserved, i64 integer, u64 offset, u64 len.
_VALUE = struct.Struct("@IIqQQ")
_pack_value = _VALUE.pack
_V_NIL, _V_INT, _V_BULK, _V_ERROR, _V_ARRAY = (
    _ffi.LH_VALUE_NIL,
    _ffi.LH_VALUE_INT,
    _ffi.LH_VALUE_BULK,
    _ffi.LH_VALUE_ERROR,
    _ffi.LH_VALUE_ARRAY,
)


def flatten_reply(reply: Any) -> tuple[bytes, int, bytes]:
    """A reply as ``lh_reply`` takes it: packed ``lh_value`` list, its length, the data
    buffer. ``reply`` is what a Redis client library returns: ``int``, ``bytes`` / ``str``
    (bulk or status), ``None``, a list, or an exception instance (an error reply, its
    message with the error code)."""
    if type(reply) is int:  # the common case: one integer, no data
        return _pack_value(_V_INT, 0, reply, 0, 0), 1, b""
    values: list[bytes] = []
    data: list[bytes] = []
    used = [0]

    def add(kind: int, raw: bytes) -> None:
        values.append(_pack_value(kind, 0, 0, used[0], len(raw)))
        data.append(raw)
        used[0] += len(raw)

    def walk(r: Any) -> None:
        if isinstance(r, bool) or r is None:
            values.append(_pack_value(_V_NIL, 0, 0, 0, 0) if r is None else _pack_value(_V_INT, 0, int(r), 0, 0))
        elif isinstance(r, int):
            values.append(_pack_value(_V_INT, 0, r, 0, 0))
        elif isinstance(r, (bytes, bytearray, memoryview)):
            add(_V_BULK, bytes(r))
        elif isinstance(r, str):
            add(_V_BULK, r.encode("utf-8"))
        elif isinstance(r, (list, tuple)):
            values.append(_pack_value(_V_ARRAY, 0, 0, 0, len(r)))
            for x in r:
                walk(x)
        elif isinstance(r, BaseException):
            add(_V_ERROR, str(r).encode("utf-8", "replace"))
        else:  # a type no RESP reply has (RESP3 maps, floats): the core refuses it as garbage
            add(_V_BULK, repr(r).encode("utf-8", "replace"))

    walk(reply)
    return b"".join(values), len(values), b"".join(data)


_V_TEXT, _V_FLOAT = _ffi.LH_VALUE_TEXT, _ffi.LH_VALUE_FLOAT
_pack_double = struct.Struct("@d").pack
_unpack_i64 = struct.Struct("@q").unpack


def flatten_rows(results: list[list[Any]]) -> tuple[bytes, int, bytes]:
    """Every statement's rows as ``lh_sql_result`` takes them: packed ``lh_value`` list (an
    array per statement, of rows, each an array of columns), its length, the data buffer.
    Columns: ``None``, ``bool`` / ``int`` (64-bit), ``float``, ``str`` (text), ``bytes``
    (blob); any other type is passed as NULL (the protocol never reads one). An integer
    outside 64 bits raises ``ValueError``."""
    values: list[bytes] = [_pack_value(_V_ARRAY, 0, 0, 0, len(results))]
    data: list[bytes] = []
    used = 0
    for rows in results:
        values.append(_pack_value(_V_ARRAY, 0, 0, 0, len(rows)))
        for row in rows:
            values.append(_pack_value(_V_ARRAY, 0, 0, 0, len(row)))
            for v in row:
                if v is None:
                    values.append(_pack_value(_V_NIL, 0, 0, 0, 0))
                elif isinstance(v, int):
                    if not -(2**63) <= v < 2**63:
                        raise ValueError(f"an integer column outside 64 bits: {v}")
                    values.append(_pack_value(_V_INT, 0, int(v), 0, 0))
                elif isinstance(v, float):
                    values.append(_pack_value(_V_FLOAT, 0, _unpack_i64(_pack_double(v))[0], 0, 0))
                elif isinstance(v, str):
                    raw = v.encode("utf-8", "surrogateescape")
                    values.append(_pack_value(_V_TEXT, 0, 0, used, len(raw)))
                    data.append(raw)
                    used += len(raw)
                elif isinstance(v, (bytes, bytearray, memoryview)):
                    raw = bytes(v)
                    values.append(_pack_value(_V_BULK, 0, 0, used, len(raw)))
                    data.append(raw)
                    used += len(raw)
                else:
                    values.append(_pack_value(_V_NIL, 0, 0, 0, 0))
    return b"".join(values), len(values), b"".join(data)


def _bounded(message: str | bytes, limit: int) -> bytes:
    raw = message if isinstance(message, bytes) else message.encode("utf-8", "replace")
    return raw[:limit]


class Output(NamedTuple):
    """One polled output (a command for the host or an event for the application).

    An immutable named tuple (cheap to build: :meth:`Core.poll_output` makes one per output).
    Fields that do not apply to the kind are 0 / ``""`` / ``b""``.
    """

    kind: int
    reason: int = 0
    request_id: int = 0
    lease_id: int = 0
    name: str = ""
    token: str = ""
    backend_data: bytes = b""
    ttl_ms: int = 0
    fencing_token: int = 0
    valid_until_ns: int = 0

    @property
    def reason_name(self) -> str:
        return _ffi.REASON_NAMES.get(self.reason, str(self.reason))


# lh_output read in one call: native ("@") alignment is the C layout of the flat struct
# (u32 kind, u32 reason, u64 request_id, u64 lease_id, then three (pointer, size_t) pairs and
# three u64). Pointers come back as plain ints.
_OUTPUT_LAYOUT = struct.Struct("@IIQQPNPNPNQQQ")
if _OUTPUT_LAYOUT.size != ctypes.sizeof(_ffi.lh_output):  # pragma: no cover - exotic ABI
    raise errors.LibraryError(
        f"lh_output layout mismatch: struct {_OUTPUT_LAYOUT.size} bytes, ctypes {ctypes.sizeof(_ffi.lh_output)}"
    )
_new_output = tuple.__new__
_string_at = ctypes.string_at
# Kinds whose name/token/backend_data are always empty (events): nothing to decode.
_EVENT_KINDS = frozenset(
    (
        _ffi.LH_OUTPUT_ACQUIRED,
        _ffi.LH_OUTPUT_ACQUIRE_FAILED,
        _ffi.LH_OUTPUT_LOST,
        _ffi.LH_OUTPUT_RELEASED,
        _ffi.LH_OUTPUT_RENEWED,
        _ffi.LH_OUTPUT_RELEASE_OUTCOME,
    )
)
_NAME_ONLY_KINDS = frozenset((_ffi.LH_OUTPUT_WATCH, _ffi.LH_OUTPUT_UNWATCH))


_check = _ffi.check


def _copy_output(fields: tuple[Any, ...]) -> Output | None:
    """An :class:`Output` from the unpacked ``lh_output`` (borrowed strings copied), or ``None``."""
    (kind, reason, req, lease, name_p, name_n, tok_p, tok_n, bd_p, bd_n, ttl, fence, valid) = fields
    if kind == 0:  # LH_OUTPUT_NONE
        return None
    if kind in _EVENT_KINDS:
        return _new_output(Output, (kind, reason, req, lease, "", "", b"", ttl, fence, valid))
    name = _string_at(name_p, name_n).decode("utf-8") if name_n else ""
    if kind in _NAME_ONLY_KINDS:
        return _new_output(Output, (kind, reason, req, lease, name, "", b"", ttl, fence, valid))
    token = _string_at(tok_p, tok_n).decode("ascii") if tok_n else ""
    data = _string_at(bd_p, bd_n) if bd_n else b""
    return _new_output(Output, (kind, reason, req, lease, name, token, data, ttl, fence, valid))


@dataclass(frozen=True)
class LeaseInfo:
    state: int
    holders: int
    fencing_token: int | None
    valid_until_ns: int | None

    @property
    def state_name(self) -> str:
        return _ffi.STATE_NAMES.get(self.state, str(self.state))


@dataclass(frozen=True)
class Counters:
    """The core's counters (``lh_counters``), read by ``client.counters()``.

    ``renewals_requested`` counts manual ``renew()`` calls the core accepted; the
    ``releases_*`` fields count how application releases ended: confirmed by the service,
    refused by it (``not_owner``), unconfirmed (no answer before the grant's TTL had
    certainly run out), or lost (the validity had run out before the release was processed).
    """

    live_leases: int = 0
    pending_cleanups: int = 0
    acquires_sent: int = 0
    grants: int = 0
    acquire_failed: int = 0
    renewals_sent: int = 0
    renewals_ok: int = 0
    renewals_failed: int = 0
    releases_sent: int = 0
    lost_rejected: int = 0
    lost_expired: int = 0
    lost_fail_budget: int = 0
    stale_results: int = 0
    time_clamped: int = 0
    renewals_requested: int = 0
    releases_confirmed: int = 0
    releases_not_owner: int = 0
    releases_unconfirmed: int = 0
    releases_lost: int = 0


def _as_u8p(data: bytes) -> "ctypes._Pointer[ctypes.c_uint8]":
    return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))


def _encode_name(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise ValueError(f"lock name is not valid UTF-8: {e}") from None


def _u64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _ffi.U64_MAX:
        raise ValueError(f"{what} must be in 0..2**64-1, got {value}")
    return value


_NO_DEADLINE = _ffi.LH_NO_DEADLINE
_U64_MAX = _ffi.U64_MAX
_REENTRANT = _ffi.LH_ACQUIRE_REENTRANT
_NO_AUTO_RENEW = _ffi.LH_ACQUIRE_NO_AUTO_RENEW


@dataclass
class _Handle:
    ptr: Any = field(default=None)  # ctypes pointer to lh_client, None once freed


class Core:
    """One core handle. Not thread-safe: serialize calls.

    :param config: core configuration (defaults from the core when omitted)
    :param seed: at least 16 bytes; ``os.urandom(32)`` when omitted
    :param clock: monotonic nanoseconds; ``time.monotonic_ns`` when omitted
    """

    def __init__(
        self,
        config: Config | None = None,
        seed: bytes | None = None,
        clock: ClockFn | None = None,
        redis: RedisOptions | None = None,
        backend: "RedisOptions | SqlOptions | EtcdOptions | None" = None,
    ) -> None:
        self._clock: ClockFn = clock or time.monotonic_ns
        if redis is not None and backend is not None:
            raise ValueError("give redis= or backend=, not both")
        options = backend if backend is not None else redis
        cfg = (config or Config()).to_c()
        seed = os.urandom(32) if seed is None else seed
        if not isinstance(seed, (bytes, bytearray)):
            raise TypeError("seed must be bytes")
        seed = bytes(seed)
        out = _ffi.lh_client_p()
        self.protocol: str | None
        if isinstance(options, RedisOptions):
            ropts = options.to_c()
            lib.lh_client_new_redis(ctypes.byref(cfg), ctypes.byref(ropts), _as_u8p(seed), len(seed), ctypes.byref(out))
            self.protocol = "redis"
        elif isinstance(options, SqlOptions):
            sopts = options.to_c()
            lib.lh_client_new_sql(ctypes.byref(cfg), ctypes.byref(sopts), _as_u8p(seed), len(seed), ctypes.byref(out))
            self.protocol = "sql"
        elif isinstance(options, EtcdOptions):
            eopts, _keep = options.to_c()
            lib.lh_client_new_etcd(ctypes.byref(cfg), ctypes.byref(eopts), _as_u8p(seed), len(seed), ctypes.byref(out))
            self.protocol = "etcd"
        elif options is None:
            lib.lh_client_new(ctypes.byref(cfg), _as_u8p(seed), len(seed), ctypes.byref(out))
            self.protocol = None
        else:
            raise TypeError(f"unknown backend options {type(options).__name__}")
        self.backend = self.protocol is not None
        self._req = _ffi.lh_request()
        self._req_ref = ctypes.byref(self._req)
        self._h = _Handle(out)
        # Reused out-params (the handle is not thread-safe anyway): no allocation per poll.
        self._out = _ffi.lh_output()
        self._out_ref = ctypes.byref(self._out)
        self._unpack_out = _OUTPUT_LAYOUT.unpack_from
        self._deadline = ctypes.c_uint64()
        self._deadline_ref = ctypes.byref(self._deadline)
        # Hot calls without errcheck (the status is tested inline; see _ffi.unchecked).
        self._poll_output = _ffi.unchecked("lh_poll_output", pointers_only=True)
        self._c_acquire = _ffi.unchecked("lh_acquire")
        self._c_release = _ffi.unchecked("lh_release")
        self._c_acquire_result = _ffi.unchecked("lh_acquire_result")
        self._c_release_result = _ffi.unchecked("lh_release_result")
        self._c_released = _ffi.unchecked("lh_released")
        self._opts = _ffi.lh_acquire_options()
        lib.lh_acquire_options_default(ctypes.byref(self._opts))
        self._opts.struct_size = ctypes.sizeof(_ffi.lh_acquire_options)
        self._opts_ref = ctypes.byref(self._opts)
        self._lease = ctypes.c_uint64()
        self._lease_ref = ctypes.byref(self._lease)
        self._poll_timeout = _ffi.unchecked("lh_poll_timeout", pointers_only=True)
        self.notifications = bool(cfg.notifications)
        self.request_timeout_ns = int(cfg.request_timeout_ns)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._h.ptr is None

    def _p(self) -> Any:
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
        raw = _encode_name(name)
        opts = self._opts  # reused: the core never retains input buffers
        opts.flags = (_REENTRANT if reentrant else 0) | (0 if auto_renew else _NO_AUTO_RENEW)
        opts.ttl_ms = ttl_ms if type(ttl_ms) is int and 0 <= ttl_ms <= _U64_MAX else _u64(ttl_ms, "ttl_ms")
        opts.wait_ns = wait_ns if type(wait_ns) is int and 0 <= wait_ns <= _U64_MAX else _u64(wait_ns, "wait_ns")
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        st = self._c_acquire(p, int(self._clock()), raw, len(raw), self._opts_ref, self._lease_ref)
        if st:
            _check(st, p, "lh_acquire")
        lease: int = self._lease.value
        return lease

    def release(self, lease: int) -> None:
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        if not (type(lease) is int and 0 <= lease <= _U64_MAX):
            _u64(lease, "lease")
        st = self._c_release(p, int(self._clock()), lease)
        if st:
            _check(st, p, "lh_release")

    def release_reported(self, lease: int) -> int:
        """Release ``lease`` and return what happened (an ``LH_RELEASING_*`` value); after
        ``LH_RELEASING_PENDING`` a RELEASE_OUTCOME event follows."""
        out = ctypes.c_uint32()
        lib.lh_release_reported(self._p(), int(self._clock()), _u64(lease, "lease"), ctypes.byref(out))
        return int(out.value)

    def renew(self, lease: int) -> None:
        """Renew ``lease`` now (or join the renewal in flight); RENEWED or LOST follows."""
        lib.lh_renew(self._p(), int(self._clock()), _u64(lease, "lease"))

    # -- results -------------------------------------------------------------------------------------
    def acquire_result(
        self,
        request_id: int,
        outcome: int,
        fencing_token: int = 0,
        ttl_ms: int = 0,
        retry_after_ms: int | None = None,
        backend_data: bytes = b"",
    ) -> None:
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        retry = _ffi.LH_NO_RETRY_HINT if retry_after_ms is None else _u64(retry_after_ms, "retry_after_ms")
        data = backend_data if type(backend_data) is bytes else bytes(backend_data)
        if not (type(fencing_token) is int and 0 <= fencing_token <= _U64_MAX):
            _u64(fencing_token, "fencing_token")
        if not (type(ttl_ms) is int and 0 <= ttl_ms <= _U64_MAX):
            _u64(ttl_ms, "ttl_ms")
        st = self._c_acquire_result(
            p, int(self._clock()), request_id, outcome, fencing_token, ttl_ms, retry, data or None, len(data)
        )
        if st:
            _check(st, p, "lh_acquire_result")

    def renew_result(self, request_id: int, outcome: int) -> None:
        lib.lh_renew_result(self._p(), int(self._clock()), request_id, outcome)

    def release_result(self, request_id: int, outcome: int) -> None:
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        st = self._c_release_result(p, int(self._clock()), request_id, outcome)
        if st:
            _check(st, p, "lh_release_result")

    def released(self, name: str) -> None:
        """A release notification for ``name`` arrived from the service."""
        raw = _encode_name(name)
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        st = self._c_released(p, int(self._clock()), raw, len(raw))
        if st:
            _check(st, p, "lh_released")

    def timeout(self) -> None:
        lib.lh_timeout(self._p(), self.now())

    # -- backend requests (a handle made with a backend's options) -------------------------------
    def poll_requests(self) -> list[tuple[int, int, Any]]:
        """Every pending backend request as ``(id, lane, payload)``, copied: ``lane`` 1 runs
        on the commands pool, 2 in order on the side worker (Redis subscriber, PostgreSQL
        listener, etcd watch streams); ``payload`` is the Redis argv, a :class:`SqlRequest`
        or an :class:`HttpRequest`."""
        if self.protocol == "sql":
            return self._poll_sql()  # type: ignore[return-value]
        if self.protocol == "etcd":
            return self._poll_http()  # type: ignore[return-value]
        return self._poll_redis()  # type: ignore[return-value]

    def _poll_redis(self) -> list[tuple[int, int, list[bytes]]]:
        p = self._p()
        req, ref, at = self._req, self._req_ref, _string_at
        reqs: list[tuple[int, int, list[bytes]]] = []
        while True:
            lib.lh_poll_request(p, ref)
            if req.id == 0:
                return reqs
            argv = req.argv
            reqs.append((req.id, req.connection, [at(argv[i].ptr, argv[i].len) for i in range(req.argc)]))

    def _poll_sql(self) -> list[tuple[int, int, SqlRequest]]:
        p = self._p()
        req = _ffi.lh_sql_request()
        ref = ctypes.byref(req)
        reqs: list[tuple[int, int, SqlRequest]] = []
        while True:
            lib.lh_sql_poll_request(p, ref)
            if req.id == 0:
                return reqs
            data = _string_at(req.data, req.data_len) if req.data_len else b""
            params: list[Any] = []
            for i in range(req.nparams):
                v = req.params[i]
                k = v.kind
                if k == _V_INT:
                    params.append(int(v.integer))
                elif k == _V_TEXT:
                    params.append(data[v.offset : v.offset + v.len].decode("utf-8"))
                elif k == _V_BULK:
                    params.append(data[v.offset : v.offset + v.len])
                elif _ffi.LH_PARAM_HOST_MONOTONIC_NS <= k <= _ffi.LH_PARAM_HOST_NAME:
                    params.append(HostFact(k))
                else:
                    params.append(None)
            statements = []
            for i in range(req.nstatements):
                st = req.statements[i]
                sql = data[st.sql_offset : st.sql_offset + st.sql_len].decode("utf-8")
                statements.append((sql, params[st.first_param : st.first_param + st.nparams]))
            reqs.append((int(req.id), int(req.connection), SqlRequest(int(req.connection), statements)))

    def _poll_http(self) -> list[tuple[int, int, HttpRequest]]:
        p = self._p()
        req = _ffi.lh_http_request()
        ref = ctypes.byref(req)
        reqs: list[tuple[int, int, HttpRequest]] = []
        while True:
            lib.lh_http_poll_request(p, ref)
            if req.id == 0:
                return reqs
            kind = int(req.kind)
            body = _string_at(req.body, req.body_len) if req.body_len else b""
            r = HttpRequest(
                kind,
                (req.method or b"").decode("ascii", "replace"),
                (req.path or b"").decode("ascii", "replace"),
                body,
                (req.authorization or b"").decode("ascii", "replace"),
            )
            reqs.append((int(req.id), 1 if kind == _ffi.LH_HTTP_UNARY else 2, r))

    # SQL inputs
    def sql_result(self, request_id: int, results: list[list[Any]]) -> None:
        """Every statement's rows (see :func:`flatten_rows`); rows the core refuses as
        malformed are reported as a transport failure of the request."""
        p, now = self._p(), int(self._clock())
        try:
            values, n, data = flatten_rows(results)
            lib.lh_sql_result(p, now, request_id, values, n, data, len(data))
        except (errors.InvalidArgument, ValueError, struct.error) as e:
            msg = _bounded(f"malformed rows: {e}", _ffi.LH_MAX_SQL_MESSAGE)
            lib.lh_sql_failed(p, now, request_id, _ffi.LH_SQL_FAILURE_TRANSPORT, msg, len(msg))

    def sql_failed(self, request_id: int, kind: int, message: str | bytes) -> None:
        msg = _bounded(message, _ffi.LH_MAX_SQL_MESSAGE)
        lib.lh_sql_failed(self._p(), int(self._clock()), request_id, kind, msg, len(msg))

    def sql_notification(self, channel: str | bytes, payload: str | bytes) -> None:
        ch, pl = _bounded(channel, _ffi.LH_MAX_SQL_MESSAGE), _bounded(payload, _ffi.LH_MAX_SQL_MESSAGE)
        lib.lh_sql_notification(self._p(), int(self._clock()), ch, len(ch), pl, len(pl))

    def sql_connection_reset(self, connection: int) -> None:
        lib.lh_sql_connection_reset(self._p(), int(self._clock()), connection)

    def status_request(self, name: str) -> int:
        """Queue a status query for ``name`` on the attached protocol (SQL, Redis or etcd);
        its id (see :meth:`poll_status`)."""
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

    def _last_error(self, fn: Any) -> str:
        ptr, n = ctypes.c_void_p(), ctypes.c_size_t()
        fn(self._p(), ctypes.byref(ptr), ctypes.byref(n))
        return _string_at(ptr.value, n.value).decode("utf-8", "replace") if n.value else ""

    def backend_last_error(self) -> str:
        """The last database error, refused schema, error body or transport failure the
        backend protocol saw (SQL and etcd; empty otherwise)."""
        if self.protocol == "sql":
            return self._last_error(lib.lh_sql_last_error)
        if self.protocol == "etcd":
            return self._last_error(lib.lh_etcd_last_error)
        return ""

    def etcd_close(self) -> None:
        """Queues the revoke of the client's pooled etcd leases (the requests follow)."""
        lib.lh_etcd_close(self._p(), int(self._clock()))

    # etcd inputs
    def http_reply(self, request_id: int, status: int, body: bytes) -> None:
        """A unary reply; a status or body the core cannot take is a failure of the request."""
        p, now = self._p(), int(self._clock())
        try:
            lib.lh_http_reply(p, now, request_id, status, body or None, len(body))
        except errors.InvalidArgument as e:
            msg = _bounded(f"unusable reply: {e}", _ffi.LH_MAX_HTTP_BODY)
            lib.lh_http_failed(p, now, request_id, msg, len(msg))

    def http_stream_message(self, request_id: int, message: bytes) -> None:
        p, now = self._p(), int(self._clock())
        try:
            lib.lh_http_stream_message(p, now, request_id, message, len(message))
        except errors.InvalidArgument as e:
            msg = _bounded(f"unusable watch message: {e}", _ffi.LH_MAX_HTTP_BODY)
            lib.lh_http_failed(p, now, request_id, msg, len(msg))

    def http_failed(self, request_id: int, message: str | bytes) -> None:
        msg = _bounded(message, _ffi.LH_MAX_HTTP_BODY)
        lib.lh_http_failed(self._p(), int(self._clock()), request_id, msg or None, len(msg))

    def etcd_counters(self) -> dict[str, int]:
        """What the etcd protocol saw (``lh_etcd_counters``), by field name."""
        c = _ffi.lh_etcd_counters()
        c.struct_size = ctypes.sizeof(_ffi.lh_etcd_counters)
        lib.lh_etcd_counters_get(self._p(), ctypes.byref(c))
        return {f: int(getattr(c, f)) for f in _ffi.ETCD_COUNTER_FIELDS}

    def backend_counters(self) -> dict[str, int]:
        """The backend protocol's counters (Redis, etcd; empty otherwise)."""
        if self.protocol == "redis":
            return self.redis_counters()
        if self.protocol == "etcd":
            return self.etcd_counters()
        return {}

    def reply(self, request_id: int, reply: Any) -> None:
        """The reply to a backend request (see :func:`flatten_reply`); a reply the core
        refuses as malformed is reported as a transport failure of the request."""
        values, n, data = flatten_reply(reply)
        p, now = self._p(), int(self._clock())
        try:
            lib.lh_reply(p, now, request_id, values, n, data, len(data))
        except errors.InvalidArgument:
            lib.lh_request_failed(p, now, request_id)

    def request_failed(self, request_id: int) -> None:
        lib.lh_request_failed(self._p(), int(self._clock()), request_id)

    def pubsub_message(self, channel: bytes, payload: bytes) -> None:
        lib.lh_pubsub_message(self._p(), int(self._clock()), channel, len(channel), payload, len(payload))

    def subscription(self, channel: bytes, subscribed: bool) -> None:
        lib.lh_subscription(self._p(), int(self._clock()), channel, len(channel), 1 if subscribed else 0)

    def redis_counters(self) -> dict[str, int]:
        """What the Redis protocol saw (``lh_redis_counters``), by field name."""
        c = _ffi.lh_redis_counters()
        c.struct_size = ctypes.sizeof(_ffi.lh_redis_counters)
        lib.lh_redis_counters_get(self._p(), ctypes.byref(c))
        return {f: int(getattr(c, f)) for f in ("subscribed",) + _ffi.REDIS_COUNTER_FIELDS}

    # -- outputs ---------------------------------------------------------------------------------------
    def poll_output(self) -> Output | None:
        """The next output, copied; ``None`` when drained."""
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        st = self._poll_output(p, self._out_ref)
        if st:
            _check(st, p, "lh_poll_output")
        return _copy_output(self._unpack_out(self._out))

    def poll_timeout(self) -> int | None:
        """The next deadline (ns on this core's clock), ``None`` when there is none."""
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        st = self._poll_timeout(p, self._deadline_ref)
        if st:
            _check(st, p, "lh_poll_timeout")
        v: int = self._deadline.value
        return None if v == _NO_DEADLINE else v

    def drain(self) -> tuple[list[Output], int | None]:
        """Every pending output in order, then the next deadline: the host's drain after an
        input (``poll_output`` until none is left, then ``poll_timeout``) in one call."""
        p = self._h.ptr
        if p is None:
            raise errors.ClientClosed("the core handle was freed")
        poll, ref, buf, unpack = self._poll_output, self._out_ref, self._out, self._unpack_out
        outs: list[Output] = []
        while True:
            st = poll(p, ref)
            if st:
                _check(st, p, "lh_poll_output")
            fields = unpack(buf)
            if fields[0] == 0:  # LH_OUTPUT_NONE
                break
            outs.append(_copy_output(fields))  # type: ignore[arg-type]
        st = self._poll_timeout(p, self._deadline_ref)
        if st:
            _check(st, p, "lh_poll_timeout")
        v: int = self._deadline.value
        return outs, None if v == _NO_DEADLINE else v

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
        return Counters(**{f: int(getattr(c, f)) for f in _ffi.COUNTER_FIELDS + _ffi.COUNTER_FIELDS_ADDED})

    def debug_panic(self) -> None:
        """Test hook: make the core panic inside the ABI boundary (poisons the handle).
        Needs a library built with the ``testing`` feature (else :class:`~leasehold.errors.LibraryError`)."""
        _ffi.hook("lh_client_debug_panic")(self._p())


def dispatch_all(outs: list[Output], dispatch: Callable[[Output], None]) -> None:
    """Hand each drained output to ``dispatch``; one that raises is logged and the rest still
    go (shared by LockClient and AsyncLockClient; dispatching never calls back into the core)."""
    for out in outs:
        try:
            dispatch(out)
        except Exception:
            logging.getLogger("leasehold").exception("leasehold: failed to dispatch %r", out)

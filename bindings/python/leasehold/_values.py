"""What crosses the IO seam: requests copied out of the core, answers flattened for it.

A polled ``lh_io_request`` becomes an :class:`IoRequest` whose ``payload`` the executor
runs unread: the argument vector of a command (``list[bytes]``), a :class:`SqlRequest` or an
:class:`HttpRequest`. Answers go back in the core's flat value format: a packed list of
``lh_value`` (an array followed by its elements, in pre-order) plus one data buffer that
string values point into. :func:`flatten_reply` builds it from what a Redis client returns,
:func:`flatten_rows` from SQL rows; an :class:`Answer` is a list already flat (the memory
service's, copied as it came). The values the core hands out besides its events live here
too: :class:`StatusAnswer`, :class:`LeaseInfo` and :class:`Counters`.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import _ffi

__all__ = [
    "Answer",
    "HostFact",
    "HttpRequest",
    "IoRequest",
    "SqlRequest",
    "decode_request",
    "flatten_reply",
    "flatten_rows",
]


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
    (``LH_CONNECTION_COMMANDS`` or ``LH_CONNECTION_NOTIFY``, the listener), in autocommit
    mode."""

    connection: int
    statements: list[tuple[str, list[Any]]]


class HttpRequest(NamedTuple):
    """One etcd gateway request, copied out of the core (``kind`` is ``LH_IO_HTTP``,
    ``LH_IO_HTTP_WATCH`` or ``LH_IO_HTTP_CANCEL``)."""

    kind: int
    method: str
    path: str
    body: bytes
    authorization: str


class IoRequest(NamedTuple):
    """One polled request: its ``id`` (answered with it), ``kind`` (``LH_IO_*``), the
    ``connection`` it runs on (``LH_CONNECTION_*``) and what to run (see the module doc)."""

    id: int
    kind: int
    connection: int
    payload: Any


class Answer(NamedTuple):
    """An answer already in the flat format: ``values`` (``nvalues`` packed ``lh_value``)
    and the ``data`` they point into."""

    values: bytes
    nvalues: int
    data: bytes


# lh_io_request read in one call (native alignment is the C layout of the flat struct):
# u64 id, u32 kind, u32 connection, argv, u32 argc, u32 nstatements, statements, params,
# size_t nparams, data, size_t data_len, method, path, authorization, u64 stream, u64 deadline,
# host, unix_path, server_name, u32 port, u32 tls. Pointers are ints.
REQUEST_LAYOUT = struct.Struct("@QIIPIIPPNPNPPPQQPPPII")
if REQUEST_LAYOUT.size != ctypes.sizeof(_ffi.lh_io_request):  # pragma: no cover - exotic ABI
    raise ImportError(
        f"lh_io_request layout mismatch: struct {REQUEST_LAYOUT.size} bytes, ctypes {ctypes.sizeof(_ffi.lh_io_request)}"
    )
# Its first fields, up to data_len: all an SQL request or a command reads.
_REQUEST_HEAD = struct.Struct("@QIIPIIPPNPN")
_BYTES = struct.Struct("@PN")  # lh_bytes
# One lh_value: u32 kind, u32 reserved, i64 integer, u64 offset, u64 len.
_VALUE = struct.Struct("@IIqQQ")
_STATEMENT = struct.Struct("@QQII")  # lh_sql_statement
_pack_value = _VALUE.pack
_new_tuple = tuple.__new__
_VALUE_SIZE, _STATEMENT_SIZE = _VALUE.size, _STATEMENT.size
_iter_values, _iter_statements = _VALUE.iter_unpack, _STATEMENT.iter_unpack
_unpack_statement = _STATEMENT.unpack
_string_at = ctypes.string_at
_V_NIL, _V_INT, _V_BULK, _V_ERROR, _V_ARRAY = (
    _ffi.LH_VALUE_NIL,
    _ffi.LH_VALUE_INT,
    _ffi.LH_VALUE_BULK,
    _ffi.LH_VALUE_ERROR,
    _ffi.LH_VALUE_ARRAY,
)
_V_TEXT, _V_FLOAT = _ffi.LH_VALUE_TEXT, _ffi.LH_VALUE_FLOAT
_HOST_FIRST, _HOST_LAST = _ffi.LH_PARAM_HOST_MONOTONIC_NS, _ffi.LH_PARAM_HOST_NAME
_COMMAND, _SQL = _ffi.LH_IO_COMMAND, _ffi.LH_IO_SQL


def _argv(ptr: int, argc: int) -> list[bytes]:
    raw = _string_at(ptr, argc * _BYTES.size)
    out = []
    for p, n in _BYTES.iter_unpack(raw):
        out.append(_string_at(p, n) if n else b"")
    return out


# Borrowed memory copied by slicing one ctypes array laid over the address space from 0: a
# slice is a plain memcpy where ``string_at`` is a foreign call (~0.1 against ~0.6 us, three
# per SQL request). Used where the whole span lies inside the array (checked per read; a
# 32-bit build, or a pointer past it, reads with ``string_at``).
_MEM_END = sys.maxsize // 2 if sys.maxsize > 2**32 else -1
_MEM: Any = (ctypes.c_char * _MEM_END).from_address(0) if _MEM_END > 0 else None
_HOST_FACTS = {int(f): f for f in HostFact}


# The texts of one-statement requests, decoded once: the core sends a few texts again and
# again, and the same str object hashes once as the executor's key for its statement.
_TEXTS: dict[bytes, str] = {}
_MAX_TEXTS = 256


def sql_request(buf: Any) -> IoRequest:
    """:func:`decode_request` of a buffer holding an ``LH_IO_SQL`` request."""
    rid, kind, conn, _argv, _argc, nst, st_p, par_p, npar, data_p, data_n = _REQUEST_HEAD.unpack_from(buf)
    mem, end = _MEM, _MEM_END
    if not data_n:
        data = b""
    else:
        data = mem[data_p : data_p + data_n] if data_p + data_n <= end else _string_at(data_p, data_n)
    params: list[Any] = []
    if npar:
        size = npar * _VALUE_SIZE
        raw = mem[par_p : par_p + size] if par_p + size <= end else _string_at(par_p, size)
        add = params.append
        for k, _r, integer, off, n in _iter_values(raw):
            if k == _V_TEXT:
                add(data[off : off + n].decode())  # UTF-8
            elif k == _V_INT:
                add(integer)
            elif k == _V_BULK:
                add(data[off : off + n])
            elif _HOST_FIRST <= k <= _HOST_LAST:
                add(_HOST_FACTS[k])
            else:
                add(None)
    if nst == 1:  # the common request: one statement, its parameters all of the request's
        raw = mem[st_p : st_p + _STATEMENT_SIZE] if st_p + _STATEMENT_SIZE <= end else _string_at(st_p, _STATEMENT_SIZE)
        off, n, first, count = _unpack_statement(raw)
        mine = params if first == 0 and count == npar else params[first : first + count]
        text = data[off : off + n]
        sql = _TEXTS.get(text)
        if sql is None:
            sql = text.decode()
            if len(_TEXTS) < _MAX_TEXTS:
                _TEXTS[text] = sql
        return _new_tuple(IoRequest, (rid, kind, conn, _new_tuple(SqlRequest, (conn, [(sql, mine)]))))
    statements = []
    if nst:
        size = nst * _STATEMENT_SIZE
        raw = mem[st_p : st_p + size] if st_p + size <= end else _string_at(st_p, size)
        for off, n, first, count in _iter_statements(raw):
            statements.append((data[off : off + n].decode(), params[first : first + count]))
    # IoRequest(...) and SqlRequest(...) without their Python __new__
    return _new_tuple(IoRequest, (rid, kind, conn, _new_tuple(SqlRequest, (conn, statements))))


def _text(ptr: int) -> str:
    return ctypes.string_at(ptr).decode("ascii", "replace") if ptr else ""


class StreamOpen(NamedTuple):
    """``LH_IO_OPEN``: connect ``stream`` to ``host``:``port`` (TLS with ``server_name``
    when ``tls``) or to ``unix_path``; give up at ``deadline`` (the core's clock, ns)."""

    stream: int
    host: str
    port: int
    tls: bool
    server_name: str
    unix_path: str
    deadline: int


_OPEN, _WRITE, _SHUTDOWN = _ffi.LH_IO_OPEN, _ffi.LH_IO_WRITE, _ffi.LH_IO_SHUTDOWN


def _stream_request(rid: int, kind: int, fields: tuple[Any, ...]) -> IoRequest:
    stream = fields[14]
    if kind == _OPEN:
        path = ctypes.string_at(fields[17]).decode("utf-8", "surrogateescape") if fields[17] else ""
        host, name = _text(fields[16]), _text(fields[18])
        return IoRequest(rid, kind, 0, StreamOpen(stream, host, fields[19], bool(fields[20]), name, path, fields[15]))
    if kind == _WRITE:
        return write_request(rid, stream, fields[9], fields[10])
    return IoRequest(rid, kind, 0, stream)


def write_request(rid: int, stream: int, data: int, n: int) -> IoRequest:
    """``LH_IO_WRITE``: the ``n`` bytes at ``data`` (copied) for ``stream``; the byte path's
    hot request, so built without the rest of the layout."""
    if not n:
        return _new_tuple(IoRequest, (rid, _WRITE, 0, (stream, b"")))
    raw = _MEM[data : data + n] if data + n <= _MEM_END else _string_at(data, n)
    return _new_tuple(IoRequest, (rid, _WRITE, 0, (stream, raw)))


def _hot_layout() -> struct.Struct:
    """``id``, ``kind``, ``data``, ``data_len`` and ``stream`` of an ``lh_io_request`` in one
    read (what a WRITE needs; the fields between are skipped)."""
    t = _ffi.lh_io_request
    data, data_len, stream = t.data.offset, t.data_len.offset, t.stream.offset
    gap = stream - (data_len + ctypes.sizeof(ctypes.c_size_t))
    layout = struct.Struct(f"@QI{data - 12}xPN{gap}xQ")
    probe = t(id=1, kind=2, data=3, data_len=4, stream=5)
    if layout.size != stream + 8 or layout.unpack_from(probe) != (1, 2, 3, 4, 5):  # pragma: no cover
        raise ImportError("lh_io_request layout mismatch (id, kind, data, data_len, stream)")
    return layout


# (id, kind, data, data_len, stream) of a polled request: Core.step reads a WRITE with it.
REQUEST_HOT = _hot_layout()




def decode_request(buf: Any) -> IoRequest | None:
    """The :class:`IoRequest` in a polled ``lh_io_request`` buffer (everything borrowed is
    copied), ``None`` for ``LH_IO_NONE``."""
    head = _REQUEST_HEAD.unpack_from(buf)  # a command's fields, without the rest
    rid, kind, conn = head[0], head[1], head[2]
    if kind == _SQL:
        return sql_request(buf)
    if kind == _COMMAND:
        return IoRequest(rid, kind, conn, _argv(head[3], head[4]))
    if kind == _ffi.LH_IO_NONE:
        return None
    fields = REQUEST_LAYOUT.unpack_from(buf)
    if _OPEN <= kind <= _SHUTDOWN:
        return _stream_request(rid, kind, fields)
    data_p, data_n = fields[9], fields[10]
    body = _string_at(data_p, data_n) if data_n else b""
    http = HttpRequest(kind, _text(fields[11]), _text(fields[12]), body, _text(fields[13]))
    return IoRequest(rid, kind, conn, http)


def flatten_reply(reply: Any) -> tuple[bytes, int, bytes]:
    """A reply as ``lh_io_reply`` takes it: packed ``lh_value`` list, its length, the data
    buffer. ``reply`` is what a Redis client library returns: ``int``, ``bytes`` / ``str``
    (bulk or status), ``None``, a list, or an exception instance (an error reply, its
    message with the error code); an :class:`Answer` passes as it is."""
    if type(reply) is int:  # the common case: one integer, no data
        return _pack_value(_V_INT, 0, reply, 0, 0), 1, b""
    if type(reply) is Answer:
        return reply.values, reply.nvalues, reply.data
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


_NARRAYS = 16
_ARRAYS = [_pack_value(_V_ARRAY, 0, 0, 0, n) for n in range(_NARRAYS)]  # packed once
_NIL = _pack_value(_V_NIL, 0, 0, 0, 0)
_TRUE, _FALSE = _pack_value(_V_INT, 0, 1, 0, 0), _pack_value(_V_INT, 0, 0, 0, 0)
_pack_double = struct.Struct("@d").pack
_unpack_i64 = struct.Struct("@q").unpack


def flatten_rows(results: list[list[Any]]) -> tuple[bytes, int, bytes]:
    """Every statement's rows as ``lh_io_reply`` takes them: packed ``lh_value`` list (an
    array per statement, of rows, each an array of columns), its length, the data buffer.
    Columns: ``None``, ``bool`` / ``int`` (64-bit), ``float``, ``str`` (text), ``bytes``
    (blob); any other type is passed as NULL (the protocol never reads one). An integer
    outside 64 bits raises ``ValueError``."""
    try:
        return _flatten_rows(results)
    except struct.error:  # an exact int outside 64 bits (struct checks the range)
        _check_ints(results)
        raise


def rows_error(results: list[list[Any]], e: Exception) -> Exception:
    """What :func:`flatten_rows` raises for ``results``, given what ``_flatten_rows`` raised."""
    if isinstance(e, struct.error):
        try:
            _check_ints(results)
        except ValueError as v:
            return v
    return e


def _check_ints(results: list[list[Any]]) -> None:
    for rows in results:
        for row in rows:
            for v in row:
                if isinstance(v, int) and not -(2**63) <= v < 2**63:
                    raise ValueError(f"an integer column outside 64 bits: {v}")


def _flatten_rows(results: list[list[Any]]) -> tuple[bytes, int, bytes]:
    arrays, pack = _ARRAYS, _pack_value
    values: list[bytes] = [arrays[len(results)] if len(results) < _NARRAYS else pack(_V_ARRAY, 0, 0, 0, len(results))]
    add = values.append
    data: list[bytes] = []
    used = 0
    for rows in results:
        add(arrays[len(rows)] if len(rows) < _NARRAYS else pack(_V_ARRAY, 0, 0, 0, len(rows)))
        for row in rows:
            add(arrays[len(row)] if len(row) < _NARRAYS else pack(_V_ARRAY, 0, 0, 0, len(row)))
            for v in row:
                t = type(v)
                if t is int:  # the common columns first, by exact type
                    add(pack(_V_INT, 0, v, 0, 0))
                elif t is bool:
                    add(_TRUE if v else _FALSE)
                elif v is None:
                    add(_NIL)
                elif isinstance(v, int):
                    if not -(2**63) <= v < 2**63:
                        raise ValueError(f"an integer column outside 64 bits: {v}")
                    add(pack(_V_INT, 0, int(v), 0, 0))
                elif isinstance(v, float):
                    add(pack(_V_FLOAT, 0, _unpack_i64(_pack_double(v))[0], 0, 0))
                elif isinstance(v, str):
                    raw = v.encode("utf-8", "surrogateescape")
                    add(pack(_V_TEXT, 0, 0, used, len(raw)))
                    data.append(raw)
                    used += len(raw)
                elif isinstance(v, (bytes, bytearray, memoryview)):
                    raw = bytes(v)
                    add(pack(_V_BULK, 0, 0, used, len(raw)))
                    data.append(raw)
                    used += len(raw)
                else:
                    add(_NIL)
    return b"".join(values), len(values), b"".join(data)


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
    """The core's counters (``lh_counters``), read by ``client.counters()``: the engine's,
    then its backend protocol's (``backend_*`` for every backend, then per backend).

    ``renewals_requested`` counts manual ``renew()`` calls the core accepted; the
    ``releases_*`` fields count how application releases ended: confirmed by the service,
    refused by it (``not_owner``), unconfirmed (no answer before the grant's TTL had
    certainly run out), or lost (the validity had run out before the release was processed).

    ``stream_*`` and ``sentinel_lookups`` count the connections of the Redis stream kind
    (``RedisStreamExecutor``): opens asked for, connections ended, host reports about ended
    ones, and master lookups sent to a sentinel; with a ``redis+cluster://`` URL,
    ``cluster_refreshes`` counts slot map questions and ``cluster_redirects`` the ``MOVED`` /
    ``ASK`` redirections followed (a steady count means the slot map is current).
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
    backend_requests: int = 0
    backend_error_replies: int = 0
    backend_garbage_replies: int = 0
    backend_stale_replies: int = 0
    backend_transport_failures: int = 0
    backend_wakeups: int = 0
    backend_ignored_messages: int = 0
    redis_script_calls: int = 0
    redis_noscript_retries: int = 0
    redis_local_refusals: int = 0
    redis_standby_takeovers: int = 0
    redis_subscriptions: int = 0
    redis_subscriber_losses: int = 0
    redis_subscribed: int = 0
    sql_migrations: int = 0
    sql_database_errors: int = 0
    etcd_leases_granted: int = 0
    etcd_txns: int = 0
    etcd_watches: int = 0
    etcd_waiting_keepalives: int = 0
    etcd_waiters_expired: int = 0
    stream_opens: int = 0
    stream_closes: int = 0
    stream_late_answers: int = 0
    sentinel_lookups: int = 0
    cluster_refreshes: int = 0
    cluster_redirects: int = 0

    def backend(self, protocol: str) -> dict[str, int]:
        """The backend protocol's counters by their short names (``requests``,
        ``wakeups``, ...; Redis adds ``script_calls`` ... ``subscribed``, SQL ``migrations``
        and ``database_errors``, etcd ``leases_granted`` ...)."""
        out = {f[len("backend_") :]: getattr(self, f) for f in _ffi.BACKEND_COUNTER_FIELDS if f.startswith("backend_")}
        prefix = protocol + "_"
        out.update({f[len(prefix) :]: getattr(self, f) for f in _ffi.BACKEND_COUNTER_FIELDS if f.startswith(prefix)})
        return out

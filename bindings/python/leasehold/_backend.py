"""The request model, shared by ``LockClient`` and ``AsyncLockClient``: one driver for every
backend.

A client's core speaks its backend's protocol itself (the memory service's calls, Redis,
SQL or etcd) and asks for IO with one poll (:meth:`~leasehold._core.Core.poll_io`). Its
*executor* runs each request unread, by the request's kind, and hands back the raw answer;
it holds no key, script, statement or reply knowledge. An executor declares
``backend_protocol`` (``"memory"``, ``"redis"``, ``"sql"`` or ``"etcd"``) and ``options``
(the core's backend options: ``MemoryOptions``, ``RedisOptions``, ``SqlOptions``,
``EtcdOptions``), has ``attach(sink)`` / ``detach()`` (one client at a time; ``sink`` takes
what arrives on the executor's own: notifications, connection changes) and, by the kinds of
request its protocol asks for (``async`` in the asyncio twins):

- ``LH_IO_COMMAND`` on the commands connection: ``command(argv)`` (the raw reply, or an
  :class:`~leasehold._values.Answer` already flat; raises on a transport failure);
  on the notify connection (the Redis subscriber): ``subscriber(argv, sink)``;
- ``LH_IO_SQL``: ``execute(request, sink)`` (a :class:`~leasehold._values.SqlRequest`;
  every statement's rows, or raises :class:`SqlFailure`) and ``take_resets()`` (the
  connections opened anew since the last call);
- ``LH_IO_HTTP``: ``post(request)`` (``(status, body)``; raises on a transport failure);
  ``LH_IO_HTTP_WATCH``: ``watch(id, request, sink)`` (opens the stream and returns; each
  message and the stream's end go to the sink); ``LH_IO_HTTP_CANCEL``: ``cancel_watch(id)``;
- the stream kinds (the core owns the wire): ``LH_IO_OPEN``: ``open(request, sink)``,
  ``LH_IO_WRITE``: ``write(stream, data)``, ``LH_IO_SHUTDOWN``: ``shutdown(stream)``, none of
  which blocks (what is read goes to the sink). Such an executor may also let an application's
  thread read the replies to what it wrote: ``hold_reads()`` / ``hold_more(held)`` /
  ``held_reads()`` around that thread's drains (a thread-local setting: the streams written
  on meanwhile are held by the thread),
  ``read_held(held, timeout, wake_fd)`` and ``release_reads(held)`` (see
  :mod:`leasehold.backends.redis_stream`).

An executor may declare ``call_timeout``: the longest one call can block, in seconds, or
``None`` when a call can block without a bound (the memory executor's ``hang()``); the
threaded client then runs its requests on its IO pool only, never on an application's thread.

An executor may also have a bounded variant of its IO method: ``command_within(argv,
timeout)``, ``execute_within(request, sink, timeout)`` or ``post_within(request, timeout)``,
the call that waits for the answer at most ``timeout`` seconds, then raises :class:`Deferred`
with what finishes it. The threaded client uses it on an application's thread, so the IO
there ends by the caller's deadline and the rest continues on the IO pool.

This module is the part both clients share: which executor method runs a request, the core
input its result becomes, and the sink of asynchronous traffic.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import replace
from functools import partial
from typing import Any, Callable

from . import _ffi, errors
from ._core import Core, Event, HostFact, HttpRequest, IoRequest, SqlRequest
from ._urls import scrub

__all__ = [
    "backend_of",
    "ThreadedExecutor",
    "ThreadedSqlExecutor",
    "twin_name",
    "lane_of",
    "execute_request",
    "execute_sql",
    "execute_request_async",
    "Deferred",
    "bounded_calls",
    "BackendSink",
    "SqlFailure",
    "host_facts",
    "host_fact_values",
    "bind_params",
    "PROTOCOLS",
    "STREAM_KINDS",
    "SIDE",
    "backend_status",
    "sql_status",
    "runs_inline",
]

log = logging.getLogger("leasehold")

PROTOCOLS = ("memory", "redis", "sql", "etcd", "stream")
COMMANDS = _ffi.LH_CONNECTION_COMMANDS
SIDE = _ffi.LH_CONNECTION_NOTIFY
"""The lane of requests that run in order beside the others: the Redis subscriber's, the
PostgreSQL listener's, etcd watch streams."""

_COMMAND, _SQL, _HTTP, _WATCH, _CANCEL = (
    _ffi.LH_IO_COMMAND,
    _ffi.LH_IO_SQL,
    _ffi.LH_IO_HTTP,
    _ffi.LH_IO_HTTP_WATCH,
    _ffi.LH_IO_HTTP_CANCEL,
)
_TRANSPORT = _ffi.LH_FAILURE_TRANSPORT
STREAM_KINDS = (_ffi.LH_IO_OPEN, _ffi.LH_IO_WRITE, _ffi.LH_IO_SHUTDOWN)
"""The stream kinds (the core owns the wire): their executor calls never block, so they run
where they are polled, in the order the core asked for them."""


class SqlFailure(Exception):
    """An SQL request failed: ``kind`` is ``LH_FAILURE_DATABASE`` (the database refused a
    statement; the transaction was rolled back) or ``LH_FAILURE_TRANSPORT`` (the connection
    broke: the outcome is unknown)."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Deferred(Exception):
    """A bounded call (``command_within``, ``execute_within``, ``post_within``) ran out of its
    caller's time: ``finish()`` completes it, blocking (its result, or it raises as the
    unbounded call would)."""

    def __init__(self, finish: Callable[[], Any]) -> None:
        super().__init__("deferred past the caller's deadline")
        self.finish = finish


_WITHIN = {"command": "command_within", "execute": "execute_within", "post": "post_within"}


def bounded_calls(executor: object) -> bool:
    """Whether ``executor``'s IO methods can run within a caller's deadline (each has its
    ``*_within`` variant): not when a subclass or the instance replaces the method alone (a
    wrapper of the IO methods would be bypassed)."""
    io = [m for m in _WITHIN if callable(getattr(executor, m, None))]
    return bool(io) and all(_bounded_method(executor, m, _WITHIN[m]) for m in io)


def _bounded_method(executor: object, method: str, within: str) -> bool:
    if not callable(getattr(executor, within, None)):
        return False
    own = vars(executor) if hasattr(executor, "__dict__") else {}
    if method in own or within in own:
        return within in own
    mro = type(executor).__mro__
    by = next((i for i, c in enumerate(mro) if method in vars(c)), len(mro))
    at = next(i for i, c in enumerate(mro) if within in vars(c))
    return at <= by


_IO_METHODS = ("command", "execute", "post")  # one of them runs every request of a protocol
_LEASE_METHODS = ("acquire", "renew", "release")


def _is_async_executor(executor: object) -> bool:
    return any(inspect.iscoroutinefunction(getattr(executor, m, None)) for m in (*_IO_METHODS, "open"))


def twin_name(obj: object) -> str | None:
    """The dotted name of the other flavour of one of leasehold's own classes
    (``AsyncRedisExecutor`` -> ``leasehold.backends.redis_executor.RedisExecutor`` and back),
    for errors that point at the right one; ``None`` when there is none."""
    import importlib

    for cls in type(obj).__mro__:
        mod, name = cls.__module__, cls.__name__
        if not mod.startswith("leasehold."):
            continue
        if name.startswith("Async"):
            cands = [(mod.removesuffix("_async"), name[5:])]
        else:
            cands = [(mod + "_async", "Async" + name), (mod, "Async" + name)]
        for m, n in cands:
            try:
                if getattr(importlib.import_module(m), n, None) is not None:
                    return f"{m}.{n}"
            except ImportError:
                continue
    return None


def backend_of(service: object, *, for_asyncio: bool = False) -> Any:
    """``service`` when it is a backend executor, else ``None``.

    Every executor works in either client where it can: for the asyncio client
    (``for_asyncio``) a synchronous executor is wrapped in :class:`ThreadedExecutor`, or
    replaced by its asyncio twin when it makes one (``for_asyncio()``: the byte path); an
    asyncio executor given to the threaded client raises ``TypeError`` naming its
    synchronous twin. An executor subclass that defines ``acquire``/``renew``/``release``
    gets a ``RuntimeWarning``: the core runs the protocol, so those methods are never
    called (the extension points are the IO methods, see the README)."""
    protocol = getattr(service, "backend_protocol", None)
    if protocol not in PROTOCOLS:
        return None
    ignored = [m for m in _LEASE_METHODS if callable(getattr(service, m, None))]
    if ignored:
        import warnings

        warnings.warn(
            f"{type(service).__name__} is a backend executor: the core runs the {protocol} protocol "
            f"and never calls its {'/'.join(ignored)}(); wrap its IO methods "
            f"({', '.join(m for m in _IO_METHODS if hasattr(service, m))}) instead",
            RuntimeWarning,
            stacklevel=3,
        )
    is_async = _is_async_executor(service)
    if for_asyncio and not is_async:
        twin = getattr(service, "for_asyncio", None)  # a byte-path executor's loop-native twin
        return twin() if callable(twin) else ThreadedExecutor(service)
    if not for_asyncio and is_async:
        twin = twin_name(service)
        raise TypeError(
            f"{type(service).__name__} is an asyncio executor: give it to leasehold.aio.AsyncLockClient"
            + (f", or use {twin} with LockClient" if twin else ", or use its synchronous twin with LockClient")
        )
    return service


def runs_inline(executor: object) -> bool:
    """Whether a request of ``executor`` may run on the thread that fed its cause (an
    application's call, the answer before it): not when the executor declares that a call
    can block without a bound (``call_timeout = None``)."""
    if not hasattr(executor, "call_timeout"):
        return True
    v = getattr(executor, "call_timeout")
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < float("inf")


class ThreadedExecutor:
    """A synchronous executor (memory, SQL, Redis, Redis Cluster, etcd) for
    ``AsyncLockClient``: its requests run in worker threads (``asyncio.to_thread``), so the
    event loop never waits for IO; the asyncio client's sink takes what the executor's own
    threads deliver from any thread."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.backend_protocol = inner.backend_protocol
        self.options = inner.options
        self.notifications = bool(getattr(inner, "notifications", True))  # as client_config reads it

    def __getattr__(self, name: str) -> Any:  # url / conninfo (scrubbed from errors), status, ...
        return getattr(self.inner, name)

    def attach(self, sink: Any = None) -> None:
        self.inner.attach(sink)

    async def detach(self) -> None:
        await asyncio.to_thread(self.inner.detach)

    async def close(self) -> None:
        await asyncio.to_thread(self.inner.close)

    def after_fork(self) -> None:
        self.inner.after_fork()

    def take_resets(self) -> list[int]:
        return list(self.inner.take_resets())

    async def execute(self, request: SqlRequest, sink: Any = None) -> list[list[tuple[Any, ...]]]:
        return list(await asyncio.to_thread(self.inner.execute, request, sink))

    async def command(self, argv: list[bytes]) -> Any:
        return await asyncio.to_thread(self.inner.command, argv)

    async def subscriber(self, argv: list[bytes], sink: Any) -> None:
        await asyncio.to_thread(self.inner.subscriber, argv, sink)

    async def post(self, request: HttpRequest) -> tuple[int, bytes]:
        status, body = await asyncio.to_thread(self.inner.post, request)
        return status, body

    async def watch(self, rid: int, request: HttpRequest, sink: Any) -> None:
        await asyncio.to_thread(self.inner.watch, rid, request, sink)

    async def cancel_watch(self, rid: int) -> None:
        await asyncio.to_thread(self.inner.cancel_watch, rid)


ThreadedSqlExecutor = ThreadedExecutor  # its first name (SQLite only)


def lane_of(req: IoRequest) -> int:
    """Where a request runs: ``SIDE`` (in order, beside the others) for the notify
    connection's requests and the etcd watch streams, else ``COMMANDS``."""
    if req.connection == SIDE or req.kind == _WATCH or req.kind == _CANCEL:
        return SIDE
    return COMMANDS


# -- host facts (SQL) ----------------------------------------------------------------------------
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


_BOOT_ID = _boot_id()
_HOST = socket.gethostname()


def host_fact_values() -> tuple[Any, ...]:
    """The host facts, read now, in :class:`HostFact` order (``values[fact -
    HostFact.MONOTONIC_NS]``): :func:`host_facts` without the dictionary, whose enum keys
    hash in Python code."""
    return (time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time_ns() // 1000, _BOOT_ID, os.getpid(), _HOST)


_FACTS_ORDER = (HostFact.MONOTONIC_NS, HostFact.WALL_US, HostFact.BOOT_ID, HostFact.PID, HostFact.HOST_NAME)
if [int(f) - HostFact.MONOTONIC_NS for f in _FACTS_ORDER] != list(range(len(_FACTS_ORDER))):  # pragma: no cover
    raise ImportError("the host facts are not numbered in a row")


def host_facts() -> dict[HostFact, Any]:
    """The host facts, read now (once per request, as the protocol asks)."""
    return dict(zip(_FACTS_ORDER, host_fact_values()))


def bind_params(params: list[Any], facts: dict[HostFact, Any]) -> list[Any]:
    """``params`` with every :class:`HostFact` replaced by its value from ``facts``."""
    return [facts[p] if isinstance(p, HostFact) else p for p in params]


# -- results -------------------------------------------------------------------------------------
def _what(payload: Any) -> str:
    if isinstance(payload, SqlRequest):
        return payload.statements[0][0][:24] if payload.statements else "sql"
    if isinstance(payload, HttpRequest):
        return payload.path
    return str(payload[0][:16].decode("ascii", "replace")) if payload else "command"


def _url_of(executor: Any) -> str | None:
    """The URL or connection string an executor was made from (its secrets are scrubbed from
    the driver errors logged and fed to the core), if it keeps one."""
    for attr in ("conninfo", "url"):
        v = getattr(executor, attr, None)
        if isinstance(v, str) and v:
            return v
    return None


def _message(e: BaseException, executor: Any) -> str:
    return scrub(str(e) or type(e).__name__, _url_of(executor), escape=False)


def stream_failed(core: Core, executor: Any, stream: int, e: BaseException) -> Callable[[], None]:
    """The input that tells the core ``stream`` closed because a call on it raised ``e``: one
    place for every driver, so each says it with the same scrubbed message."""
    return partial(core.stream_closed, stream, _message(e, executor))


def _failed(core: Core, executor: Any, req: IoRequest, e: BaseException) -> Callable[[], None]:
    msg = _message(e, executor)
    log.warning("leasehold: backend request %s failed (transport error): %s", _what(req.payload), msg)
    return partial(core.failed, req.id, _TRANSPORT, msg)


def _sql_done(core: Core, executor: Any, rid: int, outcome: Any) -> Callable[[], None]:
    """The input for a finished SQL request: its rows or its failure, then the connections
    the executor opened anew meanwhile."""
    resets: list[int] = executor.take_resets()
    if isinstance(outcome, SqlFailure):
        first: Callable[[], None] = partial(core.failed, rid, outcome.kind, _message(outcome, executor))
    else:
        first = partial(core.sql_result, rid, outcome)
    if not resets:
        return first
    return _then_reopened(core, first, resets)


def _then_reopened(core: Core, first: Callable[[], None], resets: list[int]) -> Callable[[], None]:
    """``first``, then the reports of the connections opened anew."""

    def feed() -> None:
        first()
        for c in resets:
            core.reopened(c)

    return feed


def _sql_fail(core: Core, executor: Any, rid: int, e: Exception) -> Callable[[], None]:
    if not isinstance(e, SqlFailure):
        e = SqlFailure(_TRANSPORT, _message(e, executor))
    return _sql_done(core, executor, rid, e)


def _nothing(_: Any) -> None:
    return None


Plan = tuple[Callable[[], Any], Callable[[Any], "Callable[[], None] | None"], Callable[[Exception], Callable[[], None]]]


def _plan(core: Core, executor: Any, sink: "BackendSink", req: IoRequest, timeout: float | None = None) -> Plan:
    """How to run one request, by its kind, for both kinds of executor: ``call()`` does the
    IO (a sync executor's result, or an async one's awaitable; within ``timeout`` seconds
    where the executor can bound it), ``done(result)`` is the
    input to feed (``None`` when the answer comes through the sink: a subscriber's
    confirmation, a watch stream), ``fail(exception)`` the input for a failure. The sync and
    asyncio clients share it, so they cannot drift apart."""
    rid, kind, payload = req.id, req.kind, req.payload
    if kind == _SQL:
        if timeout is not None:  # given only for an executor with bounded_calls()
            run = partial(executor.execute_within, payload, sink, timeout)
        else:
            run = partial(executor.execute, payload, sink)
        return run, partial(_sql_done, core, executor, rid), partial(_sql_fail, core, executor, rid)
    fail = partial(_failed, core, executor, req)
    if kind == _COMMAND:
        if req.connection == SIDE:
            return partial(executor.subscriber, payload, sink), _nothing, fail
        if timeout is not None:  # given only for an executor with bounded_calls()
            call = partial(executor.command_within, payload, timeout)
        else:
            call = partial(executor.command, payload)
        return call, partial(partial, core.reply, rid), fail
    if kind == _HTTP:
        if timeout is not None:
            call = partial(executor.post_within, payload, timeout)
        else:
            call = partial(executor.post, payload)
        return call, lambda r: partial(core.http_reply, rid, r[0], r[1]), fail
    if kind == _WATCH:
        return partial(executor.watch, rid, payload, sink), _nothing, fail
    if kind == _CANCEL:
        return partial(executor.cancel_watch, rid), _nothing, fail

    if kind in STREAM_KINDS:
        stream = payload.stream if kind == _ffi.LH_IO_OPEN else payload if kind == _ffi.LH_IO_SHUTDOWN else payload[0]

        def closed(e: Exception) -> Callable[[], None]:
            return stream_failed(core, executor, stream, e)

        if kind == _ffi.LH_IO_OPEN:
            return partial(executor.open, payload, sink), _nothing, closed
        if kind == _ffi.LH_IO_WRITE:
            return partial(executor.write, stream, payload[1]), _nothing, closed
        return partial(executor.shutdown, stream), _nothing, closed

    def unknown() -> None:
        raise ValueError(f"a request of unknown kind {kind}")

    return unknown, _nothing, fail


def execute_request(
    core: Core, executor: Any, sink: "BackendSink", req: IoRequest, timeout: float | None = None
) -> Callable[[], None] | None:
    """Run one request with a sync executor; the input to feed, ``None`` when the answer comes
    through the sink. With ``timeout`` (an application's thread; only for an executor with
    :func:`bounded_calls`) a request still unanswered past it raises :class:`Deferred`, whose
    ``finish()`` completes the request (blocking) and returns the input."""
    if req.kind == _SQL:
        return execute_sql(core, executor, sink, req, timeout)
    try:
        call, done, fail = _plan(core, executor, sink, req, timeout)
    except Exception as e:  # the executor lacks the method for this kind of request
        return _failed(core, executor, req, e)
    try:
        result = call()
    except Deferred as d:
        raise Deferred(partial(_finish, d.finish, done, fail)) from None
    except Exception as e:
        return fail(e)
    return done(result)


def execute_sql(
    core: Core, executor: Any, sink: "BackendSink", req: IoRequest, timeout: float | None = None
) -> Callable[[], None] | None:
    """:func:`execute_request` of an SQL request, the plan spelled out (no partials made for
    the common outcome: it runs once per lock operation)."""
    try:
        run = executor.execute if timeout is None else executor.execute_within
    except Exception as e:  # the executor lacks the method
        return _failed(core, executor, req, e)
    rid = req.id
    try:
        rows = run(req.payload, sink) if timeout is None else run(req.payload, sink, timeout)
    except Deferred as d:
        done, fail = partial(_sql_done, core, executor, rid), partial(_sql_fail, core, executor, rid)
        raise Deferred(partial(_finish, d.finish, done, fail)) from None
    except Exception as e:
        return _sql_fail(core, executor, rid, e)
    if type(rows) is not list:
        return _sql_done(core, executor, rid, rows)
    # _sql_done's common case inline.
    resets: list[int] = executor.take_resets()
    first = partial(core.sql_result, rid, rows)
    return _then_reopened(core, first, resets) if resets else first


def _finish(finish: Callable[[], Any], done: Callable[[Any], Any], fail: Callable[[Exception], Any]) -> Any:
    try:
        result = finish()
    except Exception as e:
        return fail(e)
    return done(result)


async def execute_request_async(
    core: Core, executor: Any, sink: "BackendSink", req: IoRequest
) -> Callable[[], None] | None:
    """The asyncio twin of :func:`execute_request` (the same plan, awaited)."""
    try:
        call, done, fail = _plan(core, executor, sink, req)
    except Exception as e:  # the executor lacks the method for this kind of request
        return _failed(core, executor, req, e)
    try:
        result = await call()
    except Exception as e:
        return fail(e)
    return done(result)


class Received:
    """Bytes read on a stream, as an input to feed: called, it feeds them
    (``Core.stream_received``); a client that is free to drain hands them to the core with
    its drain instead (``Core.step(stream, data)``: one crossing)."""

    __slots__ = ("core", "stream", "data")

    def __init__(self, core: Core, stream: int, data: bytes) -> None:
        self.core = core
        self.stream = stream
        self.data = data

    def __call__(self) -> None:
        self.core.stream_received(self.stream, self.data)


def step_received(core: Core, stream: int, data: bytes) -> tuple[list[IoRequest], list[Event], int | None]:
    """``core.step(stream, data)``: bytes read, fed and drained in one crossing. Bytes the
    core refuses (taken back whole) are logged, and the drain goes on as after any input."""
    try:
        return core.step(stream, data)
    except (errors.ClientClosed, errors.CorePanic, errors.CorePoisoned):
        raise
    except Exception:
        log.exception("leasehold: the core refused an input")
        return core.step()


class BackendSink:
    """Passes a backend's asynchronous traffic to the core through ``feed(fn)`` (which
    serializes it with the client's other core calls): notifications (Redis pub/sub, a
    PostgreSQL NOTIFY, a memory-service release), subscription changes and reconnections,
    etcd watch messages and stream ends."""

    def __init__(self, core: Core, feed: Callable[[Callable[[], None]], None]) -> None:
        self._core = core
        self._feed = feed

    def message(self, channel: bytes, payload: bytes = b"") -> None:
        """A notification (channel, payload) on any connection."""
        self._feed(partial(self._core.message, channel, payload))

    def subscription(self, channel: bytes, subscribed: bool) -> None:
        """A subscription of ``channel`` took effect, or ended (or its connection broke)."""
        self._feed(partial(self._core.subscription, channel, subscribed))

    def notification(self, channel: str | bytes, payload: str | bytes) -> None:
        """A PostgreSQL NOTIFY (the same as :meth:`message`)."""
        self._feed(partial(self._core.message, channel, payload))

    def connection_reset(self, connection: int) -> None:
        """``connection`` (``LH_CONNECTION_*``) was opened anew."""
        self._feed(partial(self._core.reopened, connection))

    def opened(self, stream: int) -> None:
        """Stream ``stream`` (an ``LH_IO_OPEN``) is connected."""
        self._feed(partial(self._core.stream_opened, stream))

    def received(self, stream: int, data: bytes) -> None:
        """Bytes read on ``stream``."""
        self._feed(Received(self._core, stream, data))

    def closed(self, stream: int, message: str) -> None:
        """``stream`` ended or failed to open."""
        self._feed(partial(self._core.stream_closed, stream, message))

    def stream_message(self, rid: int, message: bytes) -> None:
        self._feed(partial(self._core.stream_message, rid, message))

    def stream_ended(self, rid: int, message: str) -> None:
        self._feed(partial(self._core.failed, rid, _TRANSPORT, message))


def backend_status(executor: Any, name: str, timeout: float = 10.0) -> Any:
    """What the backend says about ``name`` (a :class:`~leasehold._core.StatusAnswer`), read
    with a sync executor (SQL, Redis, Redis on bytes or etcd) on a core of its own: the core writes the
    query (and, for SQL, the migration before it), the executor runs it. Raises
    ``TimeoutError`` when no answer came within ``timeout`` seconds."""
    from ._core import Config

    core = Core(Config(), backend=executor.options)
    # A status query needs no notification; on the byte path what the executor's threads
    # read (a stream opened, bytes, its end) is fed here, on this thread, in order.
    inbox: deque[Callable[[], None]] = deque()
    arrived = threading.Event()
    streams = getattr(executor, "backend_protocol", None) == "stream"

    def feed(fn: Callable[[], None]) -> None:
        if streams:
            inbox.append(fn)
            arrived.set()

    sink = BackendSink(core, feed)
    executor.attach(sink)
    try:
        core.status_request(name)
        end = time.monotonic() + timeout
        while True:
            arrived.clear()
            ran = bool(inbox)
            while inbox:
                inbox.popleft()()
            for req in core.poll_io():
                ran = True
                fn = execute_request(core, executor, sink, req)
                if fn is not None:
                    fn()
            got = core.poll_status()
            if got is not None:
                answer = got[1]
                why = core.backend_last_error() if streams and not answer.ok else ""
                if why and why not in answer.error:  # the stream's own reason (refused, TLS...)
                    answer = replace(answer, error=f"{answer.error}: {why}")
                return answer
            if time.monotonic() > end:
                raise TimeoutError(f"no status of {name!r} within {timeout:g}s: {core.backend_last_error()}")
            if not ran:  # an answer may have queued the next request (the migration's query)
                arrived.wait(0.01)
            core.timeout()
    finally:
        executor.detach()
        core.close()


sql_status = backend_status  # its first name

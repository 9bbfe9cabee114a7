"""The request model, shared by ``LockClient`` and ``AsyncLockClient``.

A client drives its core in one of two ways:

* a **service** (:class:`~leasehold.service.LockService`, the memory and SQLite backends):
  the core's commands (acquire, renew, release, watch) become service calls;
* a **backend executor**: the core speaks the backend's protocol itself (Redis, SQL or
  etcd), and the executor only runs the requests it polls, verbatim, handing back raw
  results. An executor declares ``backend_protocol`` and ``options`` (the core's protocol
  options: ``RedisOptions``, ``SqlOptions``, ``EtcdOptions``), and has ``attach()`` /
  ``detach()`` (one client at a time) and, by protocol (``async`` in the asyncio twins):

  - ``"redis"``: ``command(argv)`` (the raw reply; raises on a transport failure) and
    ``subscriber(argv, sink)``;
  - ``"sql"``: ``execute(request, sink)`` (a :class:`~leasehold._core.SqlRequest`; every
    statement's rows, or raises :class:`SqlFailure`; the PostgreSQL listener's
    notifications and reconnections go to the sink) and ``take_resets()`` (the
    connections opened anew since the last call);
  - ``"etcd"``: ``post(request)`` (``(status, body)``; raises on a transport failure),
    ``watch(id, request, sink)`` (opens the stream and returns; each message and the
    stream's end go to the sink) and ``cancel_watch(id)``.

This module is the part of the request model both clients share: polling requests, turning
an executor's result into the core input to feed, and the sink of asynchronous traffic.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import time
from functools import partial
from typing import Any, Callable

from . import _ffi
from ._core import Core, HostFact, HttpRequest, SqlRequest
from ._urls import scrub

__all__ = [
    "backend_of",
    "ThreadedExecutor",
    "ThreadedSqlExecutor",
    "twin_name",
    "run_requests",
    "execute_request",
    "execute_request_async",
    "BackendSink",
    "SqlFailure",
    "host_facts",
    "bind_params",
    "PROTOCOLS",
    "backend_status",
    "sql_status",
]

log = logging.getLogger("leasehold")

PROTOCOLS = ("redis", "sql", "etcd")
_SIDE = 2  # the lane of the Redis subscriber, the PostgreSQL listener and etcd watch streams


class SqlFailure(Exception):
    """An SQL request failed: ``kind`` is ``LH_SQL_FAILURE_DATABASE`` (the database refused
    a statement; the transaction was rolled back) or ``LH_SQL_FAILURE_TRANSPORT`` (the
    connection broke: the outcome is unknown)."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_IO_METHODS = ("command", "execute", "post")  # one of them runs every request of a protocol
_LEASE_METHODS = ("acquire", "renew", "release")


def _is_async_executor(executor: object) -> bool:
    return any(inspect.iscoroutinefunction(getattr(executor, m, None)) for m in _IO_METHODS)


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
    (``for_asyncio``) a synchronous executor is wrapped in :class:`ThreadedExecutor`; an
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
            f"({', '.join(m for m in _IO_METHODS if hasattr(service, m))}) or implement a "
            "leasehold.service.LockService instead",
            RuntimeWarning,
            stacklevel=3,
        )
    is_async = _is_async_executor(service)
    if for_asyncio and not is_async:
        return ThreadedExecutor(service)
    if not for_asyncio and is_async:
        twin = twin_name(service)
        raise TypeError(
            f"{type(service).__name__} is an asyncio executor: give it to leasehold.aio.AsyncLockClient"
            + (f", or use {twin} with LockClient" if twin else ", or use its synchronous twin with LockClient")
        )
    return service


class _LoopSink:
    """Passes traffic an executor's own threads produce (a Redis subscriber's reader, the
    PostgreSQL listener, an etcd watch stream) to the client's sink on its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Any) -> None:
        self._loop = loop
        self._sink = sink

    def __getattr__(self, name: str) -> Callable[..., None]:
        fn = getattr(self._sink, name)

        def call(*args: Any) -> None:
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile
                pass

        return call


class ThreadedExecutor:
    """A synchronous executor (SQL, Redis, Redis Cluster, etcd) for ``AsyncLockClient``: its
    requests run in worker threads (``asyncio.to_thread``), so the event loop never waits for
    IO, and what its own threads deliver reaches the sink on the loop."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.backend_protocol = inner.backend_protocol
        self.options = inner.options
        self.notifications = bool(getattr(inner, "notifications", True))  # as client_config reads it
        self._sinks: dict[int, _LoopSink] = {}

    def __getattr__(self, name: str) -> Any:  # url / conninfo (scrubbed from errors), status, ...
        return getattr(self.inner, name)

    def _sink(self, sink: Any) -> Any:
        if sink is None:
            return None
        s = self._sinks.get(id(sink))
        if s is None or s._sink is not sink:
            s = self._sinks[id(sink)] = _LoopSink(asyncio.get_running_loop(), sink)
        return s

    def attach(self) -> None:
        self.inner.attach()

    async def detach(self) -> None:
        await asyncio.to_thread(self.inner.detach)

    async def close(self) -> None:
        await asyncio.to_thread(self.inner.close)

    def after_fork(self) -> None:
        self.inner.after_fork()

    def take_resets(self) -> list[int]:
        return list(self.inner.take_resets())

    async def execute(self, request: SqlRequest, sink: Any = None) -> list[list[tuple[Any, ...]]]:
        return list(await asyncio.to_thread(self.inner.execute, request, self._sink(sink)))

    async def command(self, argv: list[bytes]) -> Any:
        return await asyncio.to_thread(self.inner.command, argv)

    async def subscriber(self, argv: list[bytes], sink: Any) -> None:
        await asyncio.to_thread(self.inner.subscriber, argv, self._sink(sink))

    async def post(self, request: HttpRequest) -> tuple[int, bytes]:
        status, body = await asyncio.to_thread(self.inner.post, request)
        return status, body

    async def watch(self, rid: int, request: HttpRequest, sink: Any) -> None:
        await asyncio.to_thread(self.inner.watch, rid, request, self._sink(sink))

    async def cancel_watch(self, rid: int) -> None:
        await asyncio.to_thread(self.inner.cancel_watch, rid)


ThreadedSqlExecutor = ThreadedExecutor  # its first name (SQLite only)


def run_requests(core: Core, submit: Callable[[int, int, Any], None]) -> None:
    """Hand every pending request to ``submit(id, lane, payload)``."""
    for rid, lane, payload in core.poll_requests():
        submit(rid, lane, payload)


# -- host facts (SQL) ----------------------------------------------------------------------------
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


_BOOT_ID = _boot_id()
_HOST = socket.gethostname()


def host_facts() -> dict[HostFact, Any]:
    """The host facts, read now (once per request, as the protocol asks)."""
    return {
        HostFact.MONOTONIC_NS: time.clock_gettime_ns(time.CLOCK_MONOTONIC),
        HostFact.WALL_US: time.time_ns() // 1000,
        HostFact.BOOT_ID: _BOOT_ID,
        HostFact.PID: os.getpid(),
        HostFact.HOST_NAME: _HOST,
    }


def bind_params(params: list[Any], facts: dict[HostFact, Any]) -> list[Any]:
    """``params`` with every :class:`HostFact` replaced by its value from ``facts``."""
    return [facts[p] if isinstance(p, HostFact) else p for p in params]


# -- results -------------------------------------------------------------------------------------
def _what(payload: Any) -> str:
    if isinstance(payload, SqlRequest):
        return payload.statements[0][0][:24] if payload.statements else "sql"
    if isinstance(payload, HttpRequest):
        return payload.path
    return str(payload[0][:16].decode("ascii", "replace"))


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


def _failed(core: Core, executor: Any, rid: int, payload: Any, e: BaseException) -> Callable[[], None]:
    msg = _message(e, executor)
    log.warning("leasehold: backend request %s failed (transport error): %s", _what(payload), msg)
    if isinstance(payload, SqlRequest):
        return partial(core.sql_failed, rid, _ffi.LH_SQL_FAILURE_TRANSPORT, msg)
    if isinstance(payload, HttpRequest):
        return partial(core.http_failed, rid, msg)
    return partial(core.request_failed, rid)


def _sql_done(core: Core, executor: Any, rid: int, outcome: Any) -> Callable[[], None]:
    """The input for a finished SQL request: its rows or its failure, then the connections
    the executor opened anew meanwhile."""
    resets: list[int] = executor.take_resets()
    if isinstance(outcome, SqlFailure):
        first: Callable[[], None] = partial(core.sql_failed, rid, outcome.kind, _message(outcome, executor))
    else:
        first = partial(core.sql_result, rid, outcome)
    if not resets:
        return first

    def feed() -> None:
        first()
        for c in resets:
            core.sql_connection_reset(c)

    return feed


def _plan(
    core: Core, executor: Any, sink: "BackendSink", rid: int, lane: int, payload: Any
) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], None] | None], Callable[[Exception], Callable[[], None]]]:
    """How to run one request, for both kinds of executor: ``call()`` does the IO (a sync
    executor's result, or an async one's awaitable), ``done(result)`` is the input to feed
    (``None`` when the answer comes through the sink: a subscriber's confirmation, a watch
    stream), ``fail(exception)`` the input for a failure. The sync and asyncio clients share
    it, so they cannot drift apart."""
    if isinstance(payload, SqlRequest):

        def sql_fail(e: Exception) -> Callable[[], None]:
            if not isinstance(e, SqlFailure):
                e = SqlFailure(_ffi.LH_SQL_FAILURE_TRANSPORT, _message(e, executor))
            return _sql_done(core, executor, rid, e)

        return partial(executor.execute, payload, sink), partial(_sql_done, core, executor, rid), sql_fail
    fail = partial(_failed, core, executor, rid, payload)
    if isinstance(payload, HttpRequest):
        if payload.kind == _ffi.LH_HTTP_UNARY:
            return partial(executor.post, payload), lambda r: partial(core.http_reply, rid, r[0], r[1]), fail
        if payload.kind == _ffi.LH_HTTP_WATCH:
            return partial(executor.watch, rid, payload, sink), _nothing, fail
        return partial(executor.cancel_watch, rid), _nothing, fail
    if lane == _SIDE:
        return partial(executor.subscriber, payload, sink), _nothing, fail
    return partial(executor.command, payload), partial(partial, core.reply, rid), fail


def _nothing(_: Any) -> None:
    return None


def execute_request(core: Core, executor: Any, sink: "BackendSink", rid: int, lane: int, payload: Any) -> Callable[[], None] | None:
    """(IO thread) Run one request with a sync executor; the input to feed, ``None`` when the
    answer comes through the sink."""
    call, done, fail = _plan(core, executor, sink, rid, lane, payload)
    try:
        result = call()
    except Exception as e:
        return fail(e)
    return done(result)


async def execute_request_async(
    core: Core, executor: Any, sink: "BackendSink", rid: int, lane: int, payload: Any
) -> Callable[[], None] | None:
    """The asyncio twin of :func:`execute_request` (the same plan, awaited)."""
    call, done, fail = _plan(core, executor, sink, rid, lane, payload)
    try:
        result = await call()
    except Exception as e:
        return fail(e)
    return done(result)


class BackendSink:
    """Passes a backend's asynchronous traffic to the core through ``feed(fn)`` (which
    serializes it with the client's other core calls): Redis pub/sub messages and
    subscription changes, PostgreSQL notifications and reconnections, etcd watch messages
    and stream ends."""

    def __init__(self, core: Core, feed: Callable[[Callable[[], None]], None]) -> None:
        self._core = core
        self._feed = feed

    def message(self, channel: bytes, payload: bytes) -> None:
        self._feed(partial(self._core.pubsub_message, channel, payload))

    def subscription(self, channel: bytes, subscribed: bool) -> None:
        self._feed(partial(self._core.subscription, channel, subscribed))

    def notification(self, channel: str | bytes, payload: str | bytes) -> None:
        self._feed(partial(self._core.sql_notification, channel, payload))

    def connection_reset(self, connection: int) -> None:
        self._feed(partial(self._core.sql_connection_reset, connection))

    def stream_message(self, rid: int, message: bytes) -> None:
        self._feed(partial(self._core.http_stream_message, rid, message))

    def stream_ended(self, rid: int, message: str) -> None:
        self._feed(partial(self._core.http_failed, rid, message))


def backend_status(executor: Any, name: str, timeout: float = 10.0) -> Any:
    """What the backend says about ``name`` (a :class:`~leasehold._core.StatusAnswer`), read
    with a sync executor (SQL, Redis or etcd) on a core of its own: the core writes the
    query (and, for SQL, the migration before it), the executor runs it. Raises
    ``TimeoutError`` when no answer came within ``timeout`` seconds."""
    from ._core import Config

    core = Core(Config(), backend=executor.options)
    sink = BackendSink(core, lambda fn: None)  # a status query needs no notification
    executor.attach()
    try:
        core.status_request(name)
        end = time.monotonic() + timeout
        while True:
            ran = False
            for rid, lane, payload in core.poll_requests():
                ran = True
                fn = execute_request(core, executor, sink, rid, lane, payload)
                if fn is not None:
                    fn()
            got = core.poll_status()
            if got is not None:
                return got[1]
            if time.monotonic() > end:
                raise TimeoutError(f"no status of {name!r} within {timeout:g}s: {core.backend_last_error()}")
            if not ran:  # an answer may have queued the next request (the migration's query)
                time.sleep(0.01)
            core.timeout()
    finally:
        executor.detach()
        core.close()


sql_status = backend_status  # its first name

"""The etcd executor: runs the core's etcd v3 requests on the cluster's JSON gateway with the
standard library's ``http.client``.

The core speaks the etcd protocol itself (keys, leases, transactions, watches and the
meaning of every reply: ``docs/etcd-protocol.md``). This module only POSTs each request's
body to a member, failing over between the members it was given, hands back the status and
the body unread, and keeps each watch stream open, passing its messages one by one. Any
member serves any request; later requests start at the member that answered last. A body or
watch message over ``LH_MAX_REPLY_DATA`` (1 MiB), or a body not complete within the timeout,
closes the connection unread: the request fails as a transport error (the stream ends).

Give it to ``LockClient`` in place of a service (one client at a time)::

    with LockClient(EtcdExecutor(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])) as c: ...

:class:`AsyncEtcdExecutor` serves ``AsyncLockClient``: it runs the same blocking HTTP calls
on a thread pool (the loop is never blocked) and passes stream messages to the loop.
"""

from __future__ import annotations

import asyncio
import http.client
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from functools import partial
from typing import Any

from .. import _ffi
from .._backend import Deferred
from .._core import EtcdOptions, HttpRequest

__all__ = ["EtcdExecutor", "AsyncEtcdExecutor", "parse_endpoints", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 2.0
"""Seconds one member may take to connect and answer before the next one is tried."""

_MAX_BODY = _ffi.LH_MAX_REPLY_DATA


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """Member base URLs from a list or a comma-separated string. ``host:port`` and
    ``etcd://host:port`` mean ``http://``; ``etcds://`` means ``https://``."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    urls: list[str] = []
    for raw in items:
        e = raw.strip().rstrip("/")
        if not e:
            continue
        if e.startswith("etcd://"):
            e = "http://" + e[len("etcd://") :]
        elif e.startswith("etcds://"):
            e = "https://" + e[len("etcds://") :]
        elif "://" not in e:
            e = "http://" + e
        u = urllib.parse.urlsplit(e)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an etcd member URL: {raw!r}")
        if u.path or u.query:
            raise ValueError(f"an etcd member URL has no path: {raw!r}")
        urls.append(e)
    if not urls:
        raise ValueError("no etcd endpoints given")
    return urls


class _Unusable(Exception):
    """A member that did not answer (the next one is tried)."""


class _Stale(Exception):
    """A kept-alive connection the server closed meanwhile (tried once more on a new one)."""


def _readable(conn: http.client.HTTPConnection, timeout: float) -> bool:
    """Whether the reply started to arrive within ``timeout`` seconds (buffered TLS data
    counts)."""
    sock = conn.sock
    if sock is None or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
        return True
    try:
        ready, _, _ = select.select([sock], [], [], max(timeout, 0.001))
    except (OSError, ValueError):
        return True  # the read says what is wrong
    return bool(ready)


def _read_body(resp: http.client.HTTPResponse, timeout: float) -> bytes:
    """The reply body, at most ``_MAX_BODY`` bytes arriving within ``timeout`` seconds;
    ``_Unusable`` otherwise (a hostile or broken member neither fills memory nor holds the
    request by dripping bytes)."""
    try:
        body = _read_bounded(resp, timeout)
    except _Unusable:
        resp.close()  # the socket goes now, unread (the response may own it alone)
        raise
    # http.client marks a Content-Length response done only when a read asks for more than
    # is left; unmarked, the pooled connection's next request fails after it was sent
    # (ResponseNotReady) and would be sent again to another member.
    resp.close()
    return body


def _read_bounded(resp: http.client.HTTPResponse, timeout: float) -> bytes:
    if resp.length is not None and resp.length > _MAX_BODY:
        raise _Unusable(f"reply body of {resp.length} bytes is over the limit of {_MAX_BODY}")
    deadline = time.monotonic() + timeout
    parts: list[bytes] = []
    size = 0
    while True:
        # read1: at most one socket read each, so the deadline is checked between them.
        part = resp.read1(min(_MAX_BODY + 1 - size, 1 << 16))
        if not part:
            if resp.length:  # what Content-Length promised never came
                raise _Unusable(f"reply body cut short ({resp.length} bytes missing)")
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > _MAX_BODY:
            raise _Unusable(f"reply body over the limit of {_MAX_BODY} bytes")
        if time.monotonic() > deadline:
            raise _Unusable(f"reply body not complete within {timeout:g} s")


class EtcdExecutor:
    """Runs an etcd-protocol core's requests on a cluster's JSON gateway (thread-safe).

    :param endpoints: member URLs (``http://host:2379``), a list or comma-separated
    :param user: etcd user (the core authenticates first and sends the token with each
        request); ``password`` its password
    :param ssl_context: for ``https://`` members (default: ``ssl.create_default_context()``)
    :param timeout: seconds one member may take before the next is tried
    """

    backend_protocol = "etcd"
    notifications = True

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        user: str | None = None,
        password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        if password is not None and user is None:
            raise ValueError("an etcd password needs a user")
        self.options = EtcdOptions(user, password)
        self._ssl = ssl_context
        self.timeout = float(timeout)
        self._preferred = 0
        self._mu = threading.Lock()
        self._local = threading.local()  # per thread: member index -> kept-alive connection
        self._streams: dict[int, http.client.HTTPConnection | None] = {}
        self._attached = False

    # -- lifecycle -----------------------------------------------------------------------------
    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        with self._mu:
            if self._attached:
                raise ValueError("this EtcdExecutor already serves a client; make one per client")
            self._attached = True

    def detach(self) -> None:
        """The client stopped: every watch stream closes."""
        with self._mu:
            self._attached = False
            streams, self._streams = self._streams, {}
        for conn in streams.values():
            _shut(conn)

    def close(self) -> None:
        self.detach()

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's connections without using them."""
        self._mu = threading.Lock()
        self._local = threading.local()
        self._streams = {}
        self._attached = False  # the child's client attaches anew

    # -- HTTP ------------------------------------------------------------------------------------
    def _connection(self, i: int, timeout: float | None) -> http.client.HTTPConnection:
        u = urllib.parse.urlsplit(self.endpoints[i])
        if u.scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            return http.client.HTTPSConnection(u.hostname or "", u.port or 2379, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(u.hostname or "", u.port or 2379, timeout=timeout)

    @staticmethod
    def _request(conn: http.client.HTTPConnection, req: HttpRequest) -> None:
        headers = {"Content-Type": "application/json"}
        if req.authorization:
            headers["Authorization"] = req.authorization
        conn.request(req.method or "POST", req.path, body=req.body, headers=headers)

    @classmethod
    def _send(cls, conn: http.client.HTTPConnection, req: HttpRequest) -> http.client.HTTPResponse:
        cls._request(conn, req)
        return conn.getresponse()

    def _try(self, i: int, req: HttpRequest, deadline: float | None = None) -> tuple[int, bytes]:
        """One member's answer. With ``deadline`` (``time.monotonic()``) a reply not begun by
        then raises :class:`~leasehold._backend.Deferred`, whose ``finish()`` reads it."""
        pool: dict[int, http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        for fresh in (False, True):
            conn = pool.pop(i, None)
            if conn is None:
                if not fresh:
                    continue
                conn = self._connection(i, self.timeout)
            elif fresh:
                conn.close()
                conn = self._connection(i, self.timeout)
            try:
                self._request(conn, req)
                if deadline is not None and not _readable(conn, deadline - time.monotonic()):
                    raise Deferred(partial(self._finish_try, pool, i, conn, fresh, req))
                return self._reply(pool, i, conn, fresh)
            except (OSError, http.client.HTTPException) as e:  # sending failed
                conn.close()
                if not fresh and isinstance(e, (ConnectionResetError, BrokenPipeError)):
                    continue
                raise _Unusable(f"{self.endpoints[i]}: {e or type(e).__name__}") from None
            except _Stale:
                continue
        raise _Unusable(f"{self.endpoints[i]}: no connection")  # pragma: no cover

    def _reply(
        self, pool: dict[int, http.client.HTTPConnection], i: int, conn: http.client.HTTPConnection, fresh: bool
    ) -> tuple[int, bytes]:
        """Read the reply of the request sent on ``conn``; the connection goes back to
        ``pool`` (a thread's own: kept only when that thread has none for the member)."""
        try:
            resp = conn.getresponse()
            body = _read_body(resp, self.timeout)
        except _Unusable as e:
            conn.close()  # the rest of the body is never read
            raise _Unusable(f"{self.endpoints[i]}: {e}") from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            # A kept-alive connection the server closed meanwhile: once more on a new one.
            if not fresh and isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                raise _Stale() from None
            raise _Unusable(f"{self.endpoints[i]}: {e or type(e).__name__}") from None
        if resp.will_close or pool.setdefault(i, conn) is not conn:
            conn.close()
        return resp.status, body

    def _finish_try(
        self, pool: dict[int, http.client.HTTPConnection], i: int, conn: http.client.HTTPConnection, fresh: bool, req: HttpRequest
    ) -> tuple[int, bytes]:
        try:
            return self._reply(pool, i, conn, fresh)
        except _Stale:
            return self._try(i, req)

    def post(self, req: HttpRequest) -> tuple[int, bytes]:
        """POST a unary request to a member, failing over to the next ones; ``(status,
        body)``. Raises ``ConnectionError`` when no member answered."""
        return self._post(req, None)

    def post_within(self, req: HttpRequest, timeout: float) -> tuple[int, bytes]:
        """:meth:`post`, waiting for a reply at most ``timeout`` seconds (an application's
        deadline); past it raises :class:`~leasehold._backend.Deferred`, whose ``finish()``
        reads the reply (and fails over, as :meth:`post`) on another thread."""
        return self._post(req, time.monotonic() + timeout)

    def _post(
        self, req: HttpRequest, deadline: float | None, k0: int = 0, start: int | None = None, errors: list[str] | None = None
    ) -> tuple[int, bytes]:
        n = len(self.endpoints)
        if start is None:
            start = self._preferred
        errors = [] if errors is None else errors
        for k in range(k0, n):
            i = (start + k) % n
            try:
                status, body = self._try(i, req, deadline)
            except _Unusable as e:
                errors.append(str(e))
                continue
            except Deferred as d:
                raise Deferred(partial(self._post_rest, req, d.finish, i, k, start, errors)) from None
            self._preferred = i
            return status, body
        self._preferred = (start + 1) % n
        raise ConnectionError("no etcd member answered: " + "; ".join(errors))

    def _post_rest(self, req: HttpRequest, finish: Any, i: int, k: int, start: int, errors: list[str]) -> tuple[int, bytes]:
        """(past the caller's deadline) The rest of a :meth:`post`: member ``i``'s reply, or
        the next members'."""
        try:
            status, body = finish()
        except _Unusable as e:
            errors.append(str(e))
            return self._post(req, None, k + 1, start, errors)
        self._preferred = i
        return status, body

    # -- watch streams -------------------------------------------------------------------------
    def watch(self, rid: int, req: HttpRequest, sink: Any) -> None:
        """Open watch stream ``rid`` on a thread of its own; its messages and its end go to
        ``sink`` (``stream_message`` / ``stream_ended``)."""
        with self._mu:
            self._streams[rid] = None
        threading.Thread(target=self._stream, args=(rid, req, sink), name="leasehold-etcd-watch", daemon=True).start()

    def cancel_watch(self, rid: int) -> None:
        """Close watch stream ``rid`` (nothing answers)."""
        with self._mu:
            conn = self._streams.pop(rid, None)
        _shut(conn)

    def _stream(self, rid: int, req: HttpRequest, sink: Any) -> None:
        why = "the watch stream ended"
        try:
            resp = self._open_stream(rid, req)
            if resp is None:
                return  # cancelled meanwhile
            while True:
                line = resp.readline(_MAX_BODY + 2)
                if not line:
                    break
                msg = line.rstrip(b"\r\n")
                if len(msg) > _MAX_BODY or (len(line) == _MAX_BODY + 2 and not line.endswith(b"\n")):
                    resp.close()  # not read on to its end: the stream closes
                    raise ValueError(f"a message over the limit of {_MAX_BODY} bytes")
                if not msg:
                    continue
                with self._mu:
                    live = rid in self._streams
                if not live:
                    return
                sink.stream_message(rid, msg)
        except Exception as e:  # broken, or closed under us by cancel_watch / detach
            why = f"the watch stream broke: {e or type(e).__name__}"
        with self._mu:
            live = rid in self._streams  # else cancelled: nobody is told
            conn = self._streams.pop(rid, None)
        if live:
            _shut(conn)
            sink.stream_ended(rid, why)

    def _open_stream(self, rid: int, req: HttpRequest) -> http.client.HTTPResponse | None:
        n = len(self.endpoints)
        start = self._preferred
        errors: list[str] = []
        for k in range(n):
            i = (start + k) % n
            conn = self._connection(i, self.timeout)
            with self._mu:
                if rid not in self._streams:
                    return None
                self._streams[rid] = conn
            try:
                resp = self._send(conn, req)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                errors.append(f"{self.endpoints[i]}: {e or type(e).__name__}")
                continue
            if resp.status != 200:
                raise ConnectionError(f"{self.endpoints[i]}: the watch answered {resp.status}")
            if conn.sock is not None:
                conn.sock.settimeout(None)  # it waits for events as long as it takes
            return resp
        raise ConnectionError("no etcd member opened the watch: " + "; ".join(errors))


def _shut(conn: http.client.HTTPConnection | None) -> None:
    if conn is None:
        return
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


class _LoopSink:
    """Passes a stream thread's traffic to a sink on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Any) -> None:
        self._loop, self._sink = loop, sink

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    def stream_message(self, rid: int, message: bytes) -> None:
        self._call(self._sink.stream_message, rid, message)

    def stream_ended(self, rid: int, message: str) -> None:
        self._call(self._sink.stream_ended, rid, message)


class AsyncEtcdExecutor:
    """The etcd executor for ``AsyncLockClient``. It runs :class:`EtcdExecutor`'s blocking
    ``http.client`` calls on the loop's default thread pool (each watch stream on a thread
    of its own) and delivers stream messages on the loop, so the loop never blocks.

    Parameters as for :class:`EtcdExecutor`.
    """

    backend_protocol = "etcd"
    notifications = True

    def __init__(self, endpoints: str | Sequence[str], **kwargs: Any) -> None:
        self.sync = EtcdExecutor(endpoints, **kwargs)
        self.options = self.sync.options
        self.endpoints = self.sync.endpoints

    def attach(self, sink: Any = None) -> None:
        self.sync.attach()

    async def detach(self) -> None:
        self.sync.detach()

    async def close(self) -> None:
        self.sync.close()

    def after_fork(self) -> None:
        self.sync.after_fork()

    async def post(self, req: HttpRequest) -> tuple[int, bytes]:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.post, req)

    async def watch(self, rid: int, req: HttpRequest, sink: Any) -> None:
        self.sync.watch(rid, req, _LoopSink(asyncio.get_running_loop(), sink))

    async def cancel_watch(self, rid: int) -> None:
        self.sync.cancel_watch(rid)

"""``RedisStreamExecutor``: Redis with the connections in the core; this executor only moves
bytes (standard library ``socket`` and ``ssl``, no Redis client).

The core parses the URL and runs the handshake, the scripts, the subscriber and the
reconnects; it asks to open a stream (TCP or Unix socket, TLS with a server name), to write
on it and to close it. Each stream has a reader and a writer thread::

    from leasehold import LockClient
    from leasehold.backends.redis_stream import RedisStreamExecutor

    with LockClient(RedisStreamExecutor("redis://127.0.0.1:6379/0")) as client:
        with client.acquire("reports", ttl=10, wait=5) as lock:
            write_report(fencing_token=lock.fencing_token)

``LockClient`` drives it (not yet ``AsyncLockClient``); Sentinel and Cluster URLs are
refused by the core on this path for now.
"""

from __future__ import annotations

import queue
import socket
import ssl
import threading
import time
from typing import Any

from .._options import RedisOptions, RedisStreamOptions
from .._values import StreamOpen

__all__ = ["RedisStreamExecutor"]


class _Stream:
    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.closed = False


class RedisStreamExecutor:
    """Moves the bytes of the core's Redis connections (see the module docs).

    :param url: ``redis://[user:pass@]host[:port][/db]``, ``rediss://…``, ``unix:///path[?db=N]``
    :param client_name: ``CLIENT SETNAME`` of the connections
    :param options: the core's Redis protocol options (standby delay, key keep time...)
    :param ssl_context: for ``rediss://`` (default: ``ssl.create_default_context()``)
    """

    backend_protocol = "stream"
    notifications = True

    def __init__(
        self,
        url: str,
        *,
        client_name: str | None = None,
        options: RedisOptions | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self.options = RedisStreamOptions(url, client_name=client_name, redis=options or RedisOptions())
        self._ssl = ssl_context
        self._mu = threading.Lock()
        self._streams: dict[int, _Stream] = {}

    def attach(self, sink: Any = None) -> None:
        """Nothing to set up: the core asks for its streams."""

    def open(self, req: StreamOpen, sink: Any) -> None:
        """Connect in the background; ``sink.opened`` or ``sink.closed`` says how it went."""
        st = _Stream()
        with self._mu:
            self._streams[req.stream] = st
        threading.Thread(target=self._run, args=(req, st, sink), name=f"leasehold-stream-{req.stream}", daemon=True).start()

    def write(self, stream: int, data: bytes) -> None:
        """Queue ``data`` for ``stream`` (never blocks)."""
        with self._mu:
            st = self._streams.get(stream)
        if st is None:
            raise ConnectionError(f"stream {stream} is not open")
        st.out.put(data)

    def shutdown(self, stream: int) -> None:
        """Close ``stream`` (its threads end; what they report next is ignored by the core)."""
        with self._mu:
            st = self._streams.pop(stream, None)
        if st is not None:
            self._close(st)

    def detach(self) -> None:
        """The client stopped: every stream closes."""
        with self._mu:
            streams, self._streams = list(self._streams.values()), {}
        for st in streams:
            self._close(st)

    close = detach

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's streams without touching their sockets."""
        self._mu, self._streams = threading.Lock(), {}

    @staticmethod
    def _close(st: _Stream) -> None:
        st.closed = True
        st.out.put(None)
        sock = st.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _connect(self, req: StreamOpen) -> socket.socket:
        timeout = min(max((req.deadline - time.monotonic_ns()) / 1e9, 0.05), 60.0)
        if req.unix_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(req.unix_path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((req.host, req.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if req.tls:
                ctx = self._ssl or ssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=req.server_name)
        sock.settimeout(None)
        return sock

    def _run(self, req: StreamOpen, st: _Stream, sink: Any) -> None:
        try:
            st.sock = sock = self._connect(req)
        except (OSError, ValueError) as e:
            sink.closed(req.stream, str(e) or type(e).__name__)
            return
        if st.closed:  # shut down while connecting
            self._close(st)
            return
        threading.Thread(target=self._write_loop, args=(req.stream, st, sock, sink), daemon=True).start()
        sink.opened(req.stream)
        why = "end of stream"
        try:
            while data := sock.recv(65536):
                sink.received(req.stream, data)
        except OSError as e:
            why = str(e) or type(e).__name__
        self._close(st)
        sink.closed(req.stream, why)

    def _write_loop(self, stream: int, st: _Stream, sock: socket.socket, sink: Any) -> None:
        while (data := st.out.get()) is not None:
            try:
                sock.sendall(data)
            except OSError as e:
                self._close(st)
                sink.closed(stream, str(e) or type(e).__name__)
                return

"""``RedisStreamExecutor``: Redis with the connections in the core; this executor only moves
bytes (standard library ``socket`` and ``ssl``, no Redis client).

The core parses the URL and runs the handshake, the scripts, the subscriber and the
reconnects; it asks to open a stream (TCP or Unix socket, TLS with a server name), to write
on it and to close it::

    from leasehold import LockClient
    from leasehold.backends.redis_stream import RedisStreamExecutor

    with LockClient(RedisStreamExecutor("redis://127.0.0.1:6379/0")) as client:
        with client.acquire("reports", ttl=10, wait=5) as lock:
            write_report(fencing_token=lock.fencing_token)

**Who moves the bytes.** A write goes out at once on the thread the core asked on (a
non-blocking send; what the socket cannot take now is flushed, in order, by a short-lived
writer thread). The replies are read on the application's thread: ``LockClient`` marks the
streams an ``acquire()``, ``release()`` or ``renew()`` wrote on as *held* by that thread, which
then reads them itself until its call is answered or its deadline passes (on a plain socket
in blocking recv() calls of a few milliseconds each), so an uncontended call hands nothing
to another thread. A stream nobody holds (the subscriber's wake messages,
a renewal sent by the timer thread, a reply that came after its caller's deadline) is read by
one background poller thread for all streams (:mod:`leasehold.backends._stream_poll`).

Ownership rule: a stream's bytes are read only by the holder of its *read lock* (a caller
that took it, or the poller thread), which feeds them to the core before letting go, so no
byte is lost or fed out of order; a caller never waits for the lock while it holds the
client mutex (it only tries it), and whoever lets go arms the poller again.

``LockClient`` drives it; ``AsyncLockClient`` drives its asyncio twin
(:mod:`leasehold.backends.redis_stream_async`, made from this one by :meth:`for_asyncio`).
``redis+sentinel://`` URLs work too (the core asks the sentinels and follows failovers), and so
do ``redis+cluster://`` URLs (the core learns the slot table and routes each name to its
master).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from typing import Any

from .._options import RedisOptions, RedisStreamOptions
from .._values import StreamOpen
from ._stream_poll import Poller

__all__ = ["RedisStreamExecutor"]

_READ = 65536
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_EOF = "end of stream"
_POLLIN = select.POLLIN
# A plain socket stays in blocking mode with a receive timeout of one slice: the caller that
# holds it waits in recv() itself (one system call per reply, where poll() and a
# non-blocking recv() take two), and every other read and write passes MSG_DONTWAIT. The
# slice bounds how late that caller sees its call settled on another thread (a timer).
_DONTWAIT: int = getattr(socket, "MSG_DONTWAIT", 0)
_SLICE = 0.005
_SLICE_TIMEVAL = struct.pack("@ll", 0, int(_SLICE * 1e6))


def _why(e: BaseException) -> str:
    return str(e) or type(e).__name__


class _Stream:
    """One stream: its socket (once connected, only its read lock's holder ever waits on it:
    see ``_DONTWAIT``), the bytes not sent yet, and its read lock (see the module docs)."""

    def __init__(self, stream: int, sink: Any) -> None:
        self.id = stream
        self.sink = sink
        self.sock: Any = None
        self.fd = -1
        self.read_lock = threading.Lock()
        self.out: deque[bytes] = deque()  # not sent yet, in order (out_lock)
        self.out_lock = threading.Lock()
        self.io_lock: Any = None  # TLS: one SSL object is not read and written at once
        self.blocking = False  # a blocking socket with a receive timeout (see _DONTWAIT)
        self.writing = False  # a writer thread flushes ``out``
        self.closed = False  # no more IO (shut down or failed)
        self.reported = False  # the core was told it closed (or asked for it)
        self.released = False  # the socket is closed and forgotten by the poller

    def recv(self) -> bytes | None:
        """Bytes read now (``b""`` at the end), ``None`` when none are there yet."""
        sock = self.sock
        try:
            if self.io_lock is None:
                data: bytes = sock.recv(_READ, _DONTWAIT)
            else:
                # read(), never recv(): an SSL socket whose SSL object is gone (shut down)
                # recv()s the raw TLS records underneath and would feed them to the core.
                with self.io_lock:
                    data = sock.read(_READ)
        except _WOULD_BLOCK:
            return None
        except ValueError:  # the SSL object is gone: the stream is over
            return b""
        return data

    def send(self, data: bytes) -> int:
        """How much of ``data`` the socket took now."""
        try:
            if self.io_lock is None:
                n: int = self.sock.send(data, _DONTWAIT)
            else:
                with self.io_lock:
                    n = self.sock.write(data)  # (never the raw socket: see recv)
        except _WOULD_BLOCK:
            return 0
        except ValueError:
            raise ConnectionError("the TLS stream is closed") from None
        return n

    def shutdown(self) -> None:
        """Wake whoever waits on the socket. On TLS the socket's own shutdown() would drop its
        SSL object under a concurrent reader, so the descriptor is shut down beneath it."""
        if self.sock is None:
            return
        try:
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def pending(self) -> bool:
        """TLS bytes already decrypted and waiting (the socket may not be readable)."""
        if self.io_lock is None:
            return False
        try:
            return bool(self.sock.pending())
        except (OSError, ValueError):
            return False


class _Held(threading.local):
    claims: list[_Stream] | None = None


class RedisStreamExecutor:
    """Moves the bytes of the core's Redis connections (see the module docs).

    :param url: ``redis://[user:pass@]host[:port][/db]``, ``rediss://…``, ``unix:///path[?db=N]``
    :param client_name: ``CLIENT SETNAME`` of the connections
    :param options: the core's Redis protocol options (standby delay, key keep time...)
    :param ssl_context: for ``rediss://`` (default: ``ssl.create_default_context()``)
    :param keepalive: TCP keepalive on the connections (a dead peer of an idle subscriber is
        found by the kernel)
    :param stream_options: the core's options whole (:class:`leasehold.RedisStreamOptions`:
        timeouts, the handshake's protocol), in place of ``client_name`` and ``options``; its
        URL is ``url``
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
        keepalive: bool = False,
        stream_options: RedisStreamOptions | None = None,
    ) -> None:
        self.url = url
        self.options = stream_options or RedisStreamOptions(url, client_name=client_name, redis=options or RedisOptions())
        self._ssl = ssl_context
        self._keepalive = keepalive
        self._mu = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._poller: Poller | None = None
        self._held = _Held()

    def attach(self, sink: Any = None) -> None:
        """Nothing to set up: the core asks for its streams."""

    def settings(self) -> dict[str, Any]:
        """The arguments that make another executor on the same server, the same way (its
        own streams): ``RedisStreamExecutor(**ex.settings())``."""
        return {
            "url": self.url,
            "stream_options": self.options,
            "ssl_context": self._ssl,
            "keepalive": self._keepalive,
        }

    def for_asyncio(self) -> Any:
        """This executor's asyncio twin (same URL, options and TLS), for ``AsyncLockClient``,
        which makes it when given this one."""
        from .redis_stream_async import AsyncRedisStreamExecutor

        return AsyncRedisStreamExecutor(**self.settings())

    # -- the core's requests (called under the client mutex: none blocks) --------------------
    def open(self, req: StreamOpen, sink: Any) -> None:
        """Connect in the background; ``sink.opened`` or ``sink.closed`` says how it went."""
        st = _Stream(req.stream, sink)
        with self._mu:
            self._streams[req.stream] = st
            if self._poller is None:
                self._poller = Poller(self._ready, "leasehold-streams")
        threading.Thread(target=self._connect_run, args=(req, st), name=f"leasehold-stream-{req.stream}", daemon=True).start()

    def write(self, stream: int, data: bytes) -> None:
        """Send ``data`` on ``stream`` now, as far as the socket takes it without blocking; the
        rest follows in order from a writer thread. On a thread that holds its reads (see
        :meth:`hold_reads`) the stream's reading is taken over by that thread when free."""
        st = self._streams.get(stream)
        if st is None or st.closed:
            raise ConnectionError(f"stream {stream} is not open")
        claims = self._held.claims
        if claims is not None and st.fd >= 0 and st not in claims and st.read_lock.acquire(False):
            claims.append(st)
            poller: Any = self._poller
            ep = poller.epoll
            if ep is None:
                poller.disarm(st.fd)
            else:  # (poller.disarm inline)
                try:
                    ep.modify(st.fd, 0)
                except (OSError, ValueError):
                    pass
        with st.out_lock:
            if st.out or st.sock is None:
                st.out.append(data)
                self._start_writer(st)
                return
            try:
                if st.io_lock is None:  # (plain socket: what st.send does, one frame less)
                    try:
                        n = st.sock.send(data, _DONTWAIT)
                    except BlockingIOError:
                        n = 0
                else:
                    n = st.send(data)
            except OSError as e:
                st.reported = True  # the core learns it from this call's failure
                failed: OSError | None = e
            else:
                failed = None
                if n < len(data):
                    st.out.append(data[n:] if n else data)
                    self._start_writer(st)
        if failed is not None:
            self._close(st)  # (takes out_lock itself: never under it)
            raise ConnectionError(_why(failed)) from None

    def shutdown(self, stream: int) -> None:
        """Close ``stream`` (what its readers see next is not reported: the core asked)."""
        with self._mu:
            st = self._streams.pop(stream, None)
        if st is not None:
            st.reported = True
            self._close(st)

    def detach(self) -> None:
        """The client stopped: every stream closes, the poller thread ends."""
        with self._mu:
            streams, self._streams = list(self._streams.values()), {}
            poller, self._poller = self._poller, None
        for st in streams:
            st.reported = True
            self._close(st)
        if poller is not None:
            poller.stop()

    close = detach

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's streams without touching their sockets."""
        if self._poller is not None:
            self._poller.after_fork()
        self._mu, self._streams, self._poller, self._held = threading.Lock(), {}, None, _Held()

    # -- reading on the caller's thread (LockClient) ------------------------------------------
    def hold_reads(self) -> None:
        """(client mutex held) The streams this thread writes on from now until
        :meth:`held_reads` are read by this thread (those whose read lock is free)."""
        self._held.claims = []

    def held_reads(self) -> list[_Stream]:
        """(client mutex held) The streams this thread took since :meth:`hold_reads`; it
        reads them (:meth:`read_held`) and lets them go (:meth:`release_reads`)."""
        claims, self._held.claims = self._held.claims, None
        return claims or []

    def hold_idle(self) -> list[_Stream]:
        """(client mutex held) Take the reading of every open stream nobody reads now, for a
        caller that waits (an acquire with a wait reads its own wake-up and grant); it lets
        them go with :meth:`release_reads`."""
        with self._mu:
            streams = list(self._streams.values())
        poller, claims = self._poller, []
        for st in streams:
            if st.fd >= 0 and not st.closed and st.read_lock.acquire(False):
                claims.append(st)
                if poller is not None:
                    poller.disarm(st.fd)
        return claims

    def hold_more(self, claims: list[_Stream]) -> None:
        """As :meth:`hold_reads`, adding to ``claims`` (a thread-local setting: the client mutex
        need not be held, only the writes it claims are made under it)."""
        self._held.claims = claims

    def read_held(self, claims: list[_Stream], timeout: float, wake: int = -1) -> list[tuple[int, bytes, str]] | None:
        """Wait at most ``timeout`` seconds for bytes on the held streams (or for ``wake``, a
        file descriptor made readable to stop waiting); returns ``(stream, bytes, "")`` for
        what was read and ``(stream, b"", why)`` for a stream that ended (its reading is
        over; the caller tells the core); ``None`` when no held stream is open any more."""
        got: list[tuple[int, bytes, str]] = []
        if len(claims) == 1 and not claims[0].closed:
            live = claims
            st = claims[0]
            if st.blocking and timeout >= _SLICE:
                # One blocking recv, at most a slice (see _DONTWAIT); the caller's loop looks
                # at its call and its deadline between slices, as after a poll.
                try:
                    data: bytes | None = st.sock.recv(_READ)
                except BlockingIOError:  # the slice passed
                    return got
                except OSError as e:
                    data, why = b"", _why(e)
                else:
                    why = _EOF
                if data:
                    return [(st.id, data, "")]
                if self._report(st):
                    self._close(st)
                    got.append((st.id, b"", why))
                return got
        else:
            live = [st for st in claims if not st.closed]
        if not live:
            return None
        if not any(st.io_lock is not None and st.pending() for st in live):
            p = select.poll()
            for st in live:
                p.register(st.fd, _POLLIN)
            if wake >= 0:
                p.register(wake, _POLLIN)
            events = p.poll(max(0, int(timeout * 1000 + 0.999)))
            if not events:
                return got
            if len(live) > 1:  # only those that fired (a waiter holds its subscriber and its commands)
                fired = {fd for fd, _ in events}
                live = [st for st in live if st.fd in fired]
        for st in live:
            try:
                data = st.recv()
            except OSError as e:
                data, why = b"", _why(e)
            else:
                why = _EOF
            if data is None:
                continue
            if data:
                got.append((st.id, data, ""))
            elif self._report(st):
                self._close(st)
                got.append((st.id, b"", why))
        return got

    def release_reads(self, claims: list[_Stream]) -> None:
        """Let go of the held streams: the poller reads them again (bytes already there
        included)."""
        poller = self._poller
        ep = poller.epoll if poller is not None else None
        for st in claims:
            st.read_lock.release()
            if st.closed:
                self._release_socket(st)
            elif ep is not None:  # (poller.arm inline)
                try:
                    ep.modify(st.fd, poller.arm_mask)  # type: ignore[union-attr]
                except (OSError, ValueError):  # removed meanwhile
                    pass
            elif poller is not None:
                poller.arm(st.fd, st)
        claims.clear()

    # -- internals -------------------------------------------------------------------------------
    def _rearm(self, st: _Stream) -> None:
        if st.closed:
            self._release_socket(st)
        elif self._poller is not None:
            self._poller.arm(st.fd, st)

    def _report(self, st: _Stream) -> bool:
        """Whether this thread reports ``st``'s end (once, and not after the core's shutdown)."""
        with st.out_lock:
            if st.reported:
                return False
            st.reported = True
            return True

    def _close(self, st: _Stream) -> None:
        """No more IO on ``st``: wake whoever waits on its socket; the socket itself is closed
        by the holder of the read lock (now, if nobody holds it)."""
        st.closed = True
        st.shutdown()
        if st.read_lock.acquire(False):
            try:
                self._release_socket(st)
            finally:
                st.read_lock.release()

    def _release_socket(self, st: _Stream) -> None:
        with st.out_lock:
            if st.released or st.sock is None:
                return
            st.released = True
        poller = self._poller
        if poller is not None and st.fd >= 0:
            poller.remove(st.fd, st)
        st.sock.close()

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
            if self._keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if req.tls:
                ctx = self._ssl or ssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=req.server_name)
        if _DONTWAIT and not req.tls:
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _SLICE_TIMEVAL)
        else:
            sock.setblocking(False)
        return sock

    def _connect_run(self, req: StreamOpen, st: _Stream) -> None:
        try:
            sock = self._connect(req)
        except (OSError, ValueError) as e:
            if self._report(st):
                st.sink.closed(req.stream, _why(e))
            return
        with st.out_lock:
            # (before the socket is published: a reader that sees no io_lock reads unlocked)
            if isinstance(sock, ssl.SSLSocket):
                st.io_lock = threading.Lock()
            else:
                st.blocking = bool(_DONTWAIT)
            st.sock, st.fd = sock, sock.fileno()
            if st.out:
                self._start_writer(st)
        if st.closed:  # shut down while connecting
            self._close(st)
            return
        poller = self._poller
        try:
            if poller is None:
                raise ValueError("detached")
            poller.add(st.fd, st)
        except (OSError, ValueError):  # detached meanwhile: nobody wants the stream
            self._close(st)
            return
        st.sink.opened(req.stream)

    def _ready(self, st: _Stream) -> None:
        """(the poller thread) Bytes arrived on ``st`` and nobody reads it: read and feed
        them, then arm it again; a caller holding it reads them instead."""
        if not st.read_lock.acquire(False):
            return  # its holder arms it again when it lets go
        try:
            while not st.closed:
                try:
                    data = st.recv()
                except OSError as e:
                    data, why = b"", _why(e)
                else:
                    why = _EOF
                if data is None:
                    break
                if not data:
                    if self._report(st):
                        self._close(st)
                        st.sink.closed(st.id, why)
                    else:
                        self._close(st)
                    break
                st.sink.received(st.id, data)
                if len(data) < _READ and not st.pending():
                    break
        finally:
            st.read_lock.release()
        self._rearm(st)

    def _start_writer(self, st: _Stream) -> None:
        """(``st.out_lock`` held) Flush ``st.out`` on a thread of its own, unless one does."""
        if st.writing or st.sock is None:
            return
        st.writing = True
        threading.Thread(target=self._flush, args=(st,), name=f"leasehold-stream-{st.id}-writer", daemon=True).start()

    def _flush(self, st: _Stream) -> None:
        while True:
            with st.out_lock:
                if not st.out or st.closed:
                    st.writing = False
                    return
                data = st.out[0]
            try:
                select.select([], [st.sock], [], 1.0)
                n = st.send(data)
            except (OSError, ValueError) as e:
                with st.out_lock:
                    st.writing = False
                if self._report(st):
                    self._close(st)
                    st.sink.closed(st.id, _why(e))
                else:
                    self._close(st)
                return
            with st.out_lock:
                if n >= len(data):
                    st.out.popleft()
                elif n:
                    st.out[0] = data[n:]

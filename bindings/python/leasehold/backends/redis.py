"""Redis lock service on redis-py (design §6).

``RedisLockService`` maps the core's commands onto the canonical Lua scripts read from the
native library (EVALSHA, falling back to EVAL when the server does not know the script yet) and
delivers release notifications through one pub/sub connection per service::

    from leasehold import LockClient
    from leasehold.backends.redis import RedisLockService

    with LockClient(RedisLockService.from_url("redis://127.0.0.1:6379/0")) as client:
        with client.lock("reports", ttl_ms=10_000) as lease:
            write_report(fencing_token=lease.fencing_token)

What this service does *not* do: decide anything about time. Connection errors, timeouts and
script errors (garbage in the keyspace: ``ResponseError("lh: ...")``) are raised as exceptions,
which the core counts as transport failures of that one request; it retries, backs off, or
declares the lease lost by its own rules.

Notifications: ``watch(name, on_released)`` subscribes the service's pub/sub thread to the
name's channel. The thread reconnects by itself (capped exponential backoff) and re-subscribes;
because messages published while it was disconnected are lost, every (re)confirmed subscription
also delivers one ``on_released(name)`` — a spurious wake-up that makes one waiter re-check the
lock at once instead of sleeping until the holder's TTL hint. A waiter never depends on a
notification to make progress: it always retries at the holder's remaining TTL or with backoff.
"""

from __future__ import annotations

import inspect
import logging
import os
import select
import threading
import time
from typing import Any, Callable

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from ..service import Granted, HeldByOther, LockService
from . import redis_protocol as proto
from .redis_protocol import ProtocolError

__all__ = ["RedisLockService", "ProtocolError"]

log = logging.getLogger("leasehold.redis")

#: Defaults used by :meth:`RedisLockService.from_url` (seconds).
DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 2.0
#: Idle pub/sub connections are PINGed this often; an unanswered PING means reconnect.
DEFAULT_PUBSUB_PING_INTERVAL = 30.0
#: An unwatched name's channel stays subscribed this long (no churn in acquire/release loops).
DEFAULT_PUBSUB_LINGER = 10.0
_RECONNECT_BASE = 0.05
_RECONNECT_CAP = 1.0


class RedisLockService(LockService):
    """A :class:`~leasehold.service.LockService` on one Redis server (or one Cluster slot owner).

    ``client`` is a ``redis.Redis`` (thread-safe, with a connection pool); it is used from the
    LockClient's IO pool and, for pub/sub, from this service's notification thread. Replies must
    not be decoded differently from redis-py's defaults except by ``decode_responses``, which
    is supported either way.

    ``close()`` stops the notification thread and, if the service created the client
    (:meth:`from_url`), disconnects its pool.
    """

    notifications = True

    def __init__(
        self,
        client: redis.Redis,
        *,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        owns_client: bool = False,
    ) -> None:
        if pubsub_ping_interval <= 0:
            raise ValueError("pubsub_ping_interval must be positive")
        if pubsub_linger < 0:
            raise ValueError("pubsub_linger must be >= 0")
        self._client = client
        self._owns_client = owns_client
        self._acquire = proto.script(proto.SCRIPT_ACQUIRE)
        self._renew = proto.script(proto.SCRIPT_RENEW)
        self._release = proto.script(proto.SCRIPT_RELEASE)
        self._sub = _Subscriber(client, pubsub_ping_interval, pubsub_linger)
        self._direct = _DirectConnections.for_client(client)
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        **redis_kwargs: Any,
    ) -> RedisLockService:
        """Connect to ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).

        Socket timeouts bound every call (a hung server becomes a transport error, never a hung
        IO thread); a dropped pooled connection is retried once at once (all three scripts are
        safe to repeat), longer outages are the core's business (its own retries and budget).
        """
        redis_kwargs.setdefault("retry", Retry(NoBackoff(), 1))
        redis_kwargs.setdefault("socket_keepalive", True)
        client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            **redis_kwargs,
        )
        return cls(client, pubsub_ping_interval=pubsub_ping_interval, pubsub_linger=pubsub_linger, owns_client=True)

    @property
    def client(self) -> redis.Redis:
        """The redis-py client this service runs on."""
        return self._client

    @property
    def call_timeout(self) -> float | None:
        """Longest one acquire/renew/release can block, in seconds; ``None`` if unbounded.

        LockClient runs an application's own first acquire and its release on the calling
        thread only when this is bounded. The bound covers connect + read timeouts for every
        attempt redis-py's retry makes, twice (EVALSHA, then EVAL after NOSCRIPT).
        """
        kw = self._client.connection_pool.connection_kwargs
        read = kw.get("socket_timeout")
        connect = kw.get("socket_connect_timeout") or read
        if not read or not connect:
            return None
        retry = kw.get("retry")
        retries = getattr(retry, "_retries", 0) if retry is not None else 0
        attempts = 1 + max(0, int(retries))
        return float(connect + read) * attempts * 2

    # ---- commands ------------------------------------------------------------------------
    def _run(self, script: proto.Script, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # First use on this server (or after a restart / SCRIPT FLUSH): EVAL sends the text
            # and caches it, so the next call's EVALSHA hits.
            return self._client.eval(script.text, len(keys), *keys, *args)

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_acquire
            return proto.parse_acquire(d.call(pack(w, token, ttl_ms), lambda: pack(w, token, ttl_ms, True)))
        k = proto.keys_for(name)
        reply = self._run(self._acquire, [k.lock, k.fence], [token, proto.ttl_arg(ttl_ms)])
        return proto.parse_acquire(reply)

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes = b"") -> bool:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_renew
            return proto.parse_flag(d.call(pack(w, token, ttl_ms), lambda: pack(w, token, ttl_ms, True)), "RENEW")
        k = proto.keys_for(name)
        return proto.parse_flag(self._run(self._renew, [k.lock], [token, proto.ttl_arg(ttl_ms)]), "RENEW")

    def release(self, name: str, token: str, backend_data: bytes = b"") -> bool:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_release
            return proto.parse_flag(d.call(pack(w, token), lambda: pack(w, token, True)), "RELEASE")
        k = proto.keys_for(name)
        return proto.parse_flag(self._run(self._release, [k.lock], [token, k.channel, name]), "RELEASE")

    # ---- inspection (CLI `leasehold status`) -----------------------------------------------
    def ping(self) -> bool:
        """One PING: raises (``redis.ConnectionError`` ...) when the server is unreachable."""
        return bool(self._client.ping())

    def status(self, name: str) -> Any:
        """What Redis says about ``name`` right now (read-only, advisory; one MULTI/EXEC).

        Returns a :class:`leasehold.backends.sqlite.LockStatus` (``holder_pid`` is always
        ``None``: Redis does not know it). Garbage in the keyspace raises :class:`ProtocolError`
        with an ``lh:`` message, as the scripts would.
        """
        from .sqlite import LockStatus  # the CLI's shared status record

        k = proto.keys_for(name)
        pipe = self._client.pipeline(transaction=True)
        pipe.type(k.lock)
        pipe.hmget(k.lock, "token", "fence")
        pipe.pttl(k.lock)
        pipe.type(k.fence)
        pipe.get(k.fence)
        lock_type, fields, pttl, fence_type, last = pipe.execute(raise_on_error=False)
        for what, t, want in (("lock", lock_type, "hash"), ("fence", fence_type, "string")):
            t = t.decode() if isinstance(t, bytes) else str(t)
            if t not in ("none", want):
                key = k.lock if what == "lock" else k.fence
                raise ProtocolError(f"lh: {what} key {key} holds a {t}, expected a {want}")
        held = isinstance(fields, list) and fields[0] is not None
        fence = _int_or_none(fields[1]) if held else None
        last_fence = _int_or_none(last)
        if (held and fence is None) or (last is not None and last_fence is None):
            raise ProtocolError(f"lh: keys of {name!r} hold values leasehold did not write")
        return LockStatus(
            name=name,
            held=held,
            fencing_token=fence,
            remaining_ttl_ms=pttl if held and isinstance(pttl, int) and pttl >= 0 else None,
            holder_pid=None,
            last_fencing_token=last_fence,
        )

    # ---- notifications ---------------------------------------------------------------------
    def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        if self._closed:
            return
        self._sub.watch(proto.keys_for(name).channel, name, on_released)

    def unwatch(self, name: str) -> None:
        self._sub.unwatch(proto.keys_for(name).channel)

    @property
    def subscriber_reconnects(self) -> int:
        """How many times the pub/sub connection was re-established (diagnostics, tests)."""
        return self._sub.reconnects

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sub.close()
        if self._direct is not None:
            self._direct.close()
        if self._owns_client:
            try:
                self._client.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("closing the redis client failed", exc_info=True)

    def __enter__(self) -> RedisLockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DirectConnections:
    """The service's own checkout of redis-py connections for the three scripts.

    A command is one ``send_packed_command`` of pre-encoded bytes and one ``read_response`` on a
    connection of the client's pool, under the connection's own ``retry`` (as redis-py's
    ``execute_command`` runs it), but without the per-call pool round: lock, readiness poll,
    bookkeeping, argument encoding. Connections are taken from the pool on demand (one per
    concurrent caller), kept in a LIFO free list and given back on ``close()``; a connection
    goes back to the list only after a complete exchange (or disconnected by redis-py after an
    error), so it never holds a stale reply. Used only for a plain pool (no client-side cache,
    UTF-8 encoding, not a single-connection client); anything else takes redis-py's path.
    """

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._free: list[Any] = []
        self._pid = os.getpid()
        self._closed = False
        # redis-py < 5.3 requires a command name (later versions deprecate passing one).
        self._checkout_args: tuple[str, ...] = ("EVALSHA",) if _needs_command_name(pool.get_connection) else ()

    @classmethod
    def for_client(cls, client: Any) -> _DirectConnections | None:
        pool = getattr(client, "connection_pool", None)
        if getattr(client, "connection", None) is not None or not isinstance(pool, redis.ConnectionPool):
            return None
        if getattr(pool, "cache", None) is not None:
            return None
        enc = str(pool.connection_kwargs.get("encoding", "utf-8")).lower().replace("-", "").replace("_", "")
        return cls(pool) if enc == "utf8" else None

    def call(self, packed: bytes, packed_eval: Callable[[], bytes]) -> Any:
        """Send ``packed`` (EVALSHA) and return the reply; after NOSCRIPT, ``packed_eval()``."""
        if self._pid != os.getpid():
            # A forked child: the parent's sockets are not ours (the pool resets itself).
            self._free, self._pid = [], os.getpid()
        free = self._free
        try:
            conn = free.pop()
        except IndexError:
            conn = self._pool.get_connection(*self._checkout_args)
        try:
            try:
                return conn.retry.call_with_retry(lambda: _exchange(conn, packed), lambda _e: conn.disconnect())
            except NoScriptError:
                # First use on this server (or after a restart / SCRIPT FLUSH): EVAL caches it.
                cmd = packed_eval()
                return conn.retry.call_with_retry(lambda: _exchange(conn, cmd), lambda _e: conn.disconnect())
        finally:
            if getattr(conn, "should_reconnect", _never)():  # a maintenance notification asked for it
                conn.disconnect()
            free.append(conn)
            if self._closed:
                self.close()

    def close(self) -> None:
        self._closed = True
        if self._pid != os.getpid():
            self._free = []
            return
        while True:
            try:
                conn = self._free.pop()
            except IndexError:
                return
            try:
                self._pool.release(conn)
            except Exception:  # pragma: no cover - best effort
                log.debug("returning a connection to the pool failed", exc_info=True)


def _never() -> bool:
    return False


def _needs_command_name(get_connection: Callable[..., Any]) -> bool:
    try:
        p = inspect.signature(get_connection).parameters.get("command_name")
    except (TypeError, ValueError):  # pragma: no cover - not introspectable
        return False
    return p is not None and p.default is inspect.Parameter.empty


def _exchange(conn: Any, packed: bytes) -> Any:
    conn.send_packed_command((packed,))  # a sequence of buffers
    return conn.read_response()


def _int_or_none(v: Any) -> int | None:
    if v is None:
        return None
    try:
        text = v.decode("ascii") if isinstance(v, bytes) else str(v)
    except UnicodeDecodeError:
        return None
    return int(text) if text.isdigit() else None


def _buffered(conn: Any) -> bool:
    """Does redis-py's parser hold bytes already read from the socket (which ``select`` does
    not see)? Asked of the pure-Python parsers' buffer without a syscall; other parsers answer
    through ``can_read(0)``."""
    unread = getattr(getattr(getattr(conn, "_parser", None), "_buffer", None), "unread_bytes", None)
    if callable(unread):
        return bool(unread())
    return bool(conn.can_read(timeout=0))


def _close_pipe(pipe: tuple[int, int] | None) -> None:
    for fd in pipe or ():
        try:
            os.close(fd)
        except OSError:
            pass


class _Subscriber:
    """One pub/sub connection on its own daemon thread.

    The thread owns the redis-py ``PubSub`` object (which is not thread-safe); ``watch`` and
    ``unwatch`` only edit the wanted set and poke a self-pipe, and the thread reconciles the
    subscriptions (an unwatched channel stays subscribed for ``linger`` seconds, so a name that
    is watched, unwatched and watched again in a loop does not churn SUBSCRIBE/UNSUBSCRIBE). It
    waits with ``select`` on the pub/sub socket and the pipe, so a new watch is subscribed at
    once and an idle subscriber costs no CPU and one PING per ``ping_interval``.
    """

    def __init__(self, client: redis.Redis, ping_interval: float, linger: float = 10.0) -> None:
        self._client = client
        self._ping_interval = ping_interval
        self._linger = linger
        self._lock = threading.Lock()
        self._wanted: dict[str, tuple[str, Callable[[str], None]]] = {}
        self._gen: dict[str, int] = {}  # bumped by every watch() of a channel
        self._next_gen = 0
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._pid = os.getpid()
        self._closed = False
        self.reconnects = 0

    # -- called from any thread --
    def watch(self, channel: str, name: str, cb: Callable[[str], None]) -> None:
        with self._lock:
            if self._closed:
                return
            self._reset_after_fork_locked()
            self._wanted[channel] = (name, cb)
            self._next_gen += 1
            self._gen[channel] = self._next_gen
            if self._thread is None or not self._thread.is_alive():
                _close_pipe(self._pipe)  # left by a thread that ended (it never should)
                self._pipe = os.pipe()
                os.set_blocking(self._pipe[0], False)
                os.set_blocking(self._pipe[1], False)
                self._thread = threading.Thread(target=self._run, name="leasehold-redis-pubsub", daemon=True)
                self._thread.start()
        self._poke()

    def unwatch(self, channel: str) -> None:
        with self._lock:
            self._reset_after_fork_locked()
            self._gen.pop(channel, None)
            if self._wanted.pop(channel, None) is None:
                return
        self._poke()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wanted.clear()
            self._gen.clear()
            thread = self._thread if self._pid == os.getpid() else None
        self._poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if thread is None or not thread.is_alive():
            _close_pipe(pipe)

    def _reset_after_fork_locked(self) -> None:
        # In a forked child the thread does not exist and the pipe is shared with the parent:
        # start over (the connection pool of redis-py resets itself after a fork).
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = None
            _close_pipe(self._pipe)  # the child's copies; the parent keeps its own
            self._pipe = None
            self._wanted.clear()
            self._gen.clear()

    def _poke(self) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        try:
            os.write(pipe[1], b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is already pending) or closed

    # -- the thread --
    def _drain_pipe(self) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        try:
            while os.read(pipe[0], 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def _wait(self, timeout: float, sock: Any = None) -> tuple[bool, bool]:
        """Sleep until the pipe or ``sock`` is readable or ``timeout``; returns
        (``sock`` readable, pipe readable)."""
        pipe = self._pipe
        fds = [pipe[0]] if pipe is not None else []
        if sock is not None:
            fds.append(sock)
        if not fds:
            time.sleep(timeout)
            return False, False
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return sock is not None, True  # a closed socket: let the read raise
        return sock is not None and sock in ready, pipe is not None and pipe[0] in ready

    def _run(self) -> None:
        backoff = _RECONNECT_BASE
        while True:
            with self._lock:
                if self._closed:
                    return
            ps = self._client.pubsub()  # type: ignore[no-untyped-call]
            try:
                self._serve(ps)
                return  # closed
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                with self._lock:
                    if self._closed:
                        return
                log.warning("leasehold redis pub/sub connection failed (%s: %s); reconnecting", type(e).__name__, e)
                if getattr(ps, "_lh_confirmed", False):
                    backoff = _RECONNECT_BASE  # it worked for a while: retry promptly
            finally:
                try:
                    ps.reset()
                except Exception:  # pragma: no cover
                    pass
            self._wait(backoff)
            self._drain_pipe()
            backoff = min(backoff * 2, _RECONNECT_CAP)
            self.reconnects += 1

    def _serve(self, ps: Any) -> None:
        subscribed: set[str] = set()
        # Unwatched channels stay subscribed for a while: a waiter that stops and starts again
        # (the usual acquire/release loop) costs no UNSUBSCRIBE/SUBSCRIBE round trip.
        lingering: dict[str, float] = {}
        seen: dict[str, int] = {}  # watch generation last served per subscribed channel
        ping_pending = False
        last_traffic = time.monotonic()
        reconcile = True
        while True:
            if reconcile:
                self._drain_pipe()
                with self._lock:
                    if self._closed:
                        return
                    wanted = dict(self._wanted)
                    gens = dict(self._gen)
                now = time.monotonic()
                plan = proto.reconcile(subscribed, wanted, gens, seen, lingering, now, self._linger)
                for target in plan.deliver:
                    self._deliver(target)
                if plan.subscribe:
                    ps.subscribe(*sorted(plan.subscribe))
                    subscribed |= plan.subscribe
                expired = plan.expired
                if expired:
                    if expired == subscribed:
                        # Nothing left to listen to: drop the connection (an unsubscribed
                        # pub/sub connection would need RESP handling we do not want) until
                        # the next watch.
                        ps.reset()
                        subscribed.clear()
                    else:
                        ps.unsubscribe(*sorted(expired))
                        subscribed -= expired
                conn = ps.connection
                if conn is None:
                    self._wait(self._ping_interval)
                    continue
                # Deliver everything already buffered or readable without blocking.
                while True:
                    msg = ps.get_message(timeout=0)
                    if msg is None:
                        break
                    last_traffic = time.monotonic()
                    ping_pending = False
                    self._handle(ps, msg)
            else:
                # Only the socket was readable: deliver what arrived, skip the bookkeeping
                # (the read uses the socket's own timeout: no settimeout round per message).
                conn = ps.connection
                while True:
                    reply = conn.read_response(disconnect_on_error=False, push_request=True)
                    msg = ps.handle_message(reply)
                    if msg is not None:
                        self._handle(ps, msg)
                    if not _buffered(conn):
                        break
                last_traffic = time.monotonic()
                ping_pending = False
            sock = getattr(conn, "_sock", None)
            if sock is None:
                raise redis.ConnectionError("pub/sub connection lost")
            now = time.monotonic()
            idle = now - last_traffic
            if idle >= self._ping_interval:
                if ping_pending:
                    raise redis.TimeoutError(f"no answer to PING within {self._ping_interval:.1f}s")
                ps.ping()
                ping_pending = True
                last_traffic = now
                reconcile = True
                continue
            timeout = self._ping_interval - idle
            if lingering:
                timeout = min(timeout, max(0.0, min(lingering.values()) - now))
            sock_ready, pipe_ready = self._wait(timeout, sock)
            # A message alone takes the short path above (the bulk of the traffic); a poke, a
            # timeout (ping, linger) or both at once run the full loop.
            reconcile = pipe_ready or not sock_ready

    def _handle(self, ps: Any, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if kind == "message":
            with self._lock:
                entry = self._wanted.get(channel) if channel is not None else None
            if entry is not None:
                self._deliver(entry)
        elif kind == "subscribe":
            ps._lh_confirmed = True
            # The subscription is live from here on; anything published before it (while we
            # were disconnected, or between the waiter's failed attempt and this moment) was
            # missed, so wake one waiter to re-check now rather than at its retry hint.
            with self._lock:
                entry = self._wanted.get(channel) if channel is not None else None
            if entry is not None:
                self._deliver(entry)

    @staticmethod
    def _deliver(entry: tuple[str, Callable[[str], None]]) -> None:
        name, cb = entry
        try:
            cb(name)
        except Exception:  # pragma: no cover - a callback bug must not kill the subscriber
            log.exception("leasehold redis on_released callback failed for %r", name)

"""Redis lock service on redis-py (docs/design.md §6).

``RedisLockService`` maps the core's commands onto the canonical Lua scripts read from the
native library (EVALSHA, falling back to EVAL when the server does not know the script yet) and
delivers release notifications through one pub/sub connection per service::

    from leasehold import LockClient
    from leasehold.backends.redis import RedisLockService

    with LockClient(RedisLockService.from_url("redis://127.0.0.1:6379/0")) as client:
        with client.acquire("reports", ttl=10, wait=5) as lock:
            write_report(fencing_token=lock.fencing_token)

What this service does *not* do: decide anything about time. Connection errors, timeouts and
script errors (garbage in the keyspace: ``ResponseError("lh: ...")``) are raised as exceptions,
which the core counts as transport failures of that one request; it retries, backs off, or
declares the lease lost by its own rules.

Waking waiters: the service's pub/sub connection subscribes one *wake channel* of its own
(``lh:wake:<random>``). While the client has waiters for a name (``watch_waiter``), its
ACQUIRE attempts carry that channel, and a refused attempt queues it on the server; a release
wakes the oldest queued client that is still connected, so one process wakes per release, not
every waiting one. A wake-up for a name nobody here waits for any more is passed on (NOTIFY).
While an ``acquire()`` waits, the pub/sub thread lends it the connection (``park``): the waiting
thread reads its own wake-up and sends its attempt, with no hand-off between threads.

Notifications: ``watch(name, on_released)`` (for ``LockClient.on_release``) subscribes the
service's pub/sub thread to the name's release channel, which hears every release.

The thread reconnects by itself (capped exponential backoff) and re-subscribes; because messages
published while it was disconnected are lost, every (re)confirmed subscription also delivers one
``on_released(name)`` (for the wake channel: one ``on_wake(name)`` per waiting name) — a
spurious wake-up that makes a waiter re-check the lock at once instead of sleeping until the
holder's TTL hint. A waiter never depends on a notification to make progress: it always retries
at the holder's remaining TTL or with backoff.
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
    wakes_one_waiter = True
    grants_on_release = True
    """Protocol 3: a RELEASE grants the lock to the oldest queued lease and tells its client
    with a grant notice, so the next holder needs no ACQUIRE round trip. ``LockClient`` then
    passes each attempt's request id as ``acquire``'s ``tag`` and takes notices through the
    ``watch_waiter`` callback (``on_wake(name, notice)``). ``direct_grants=False`` keeps to
    protocol 2 (a release wakes the next client, which then asks)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        owns_client: bool = False,
        direct_grants: bool = True,
    ) -> None:
        if pubsub_ping_interval <= 0:
            raise ValueError("pubsub_ping_interval must be positive")
        if pubsub_linger < 0:
            raise ValueError("pubsub_linger must be >= 0")
        self._client = client
        self._owns_client = owns_client
        # False: protocol 2 only (a release wakes the next client, which then asks).
        self.grants_on_release = bool(direct_grants)
        self._acquire = proto.script(proto.SCRIPT_ACQUIRE)
        self._renew = proto.script(proto.SCRIPT_RENEW)
        self._release = proto.script(proto.SCRIPT_RELEASE)
        self._notify = proto.script(proto.SCRIPT_NOTIFY)
        self._sub = _Subscriber(client, pubsub_ping_interval, pubsub_linger, self._pass_on, self._release_stray)
        self._queued = proto.QueueEntries()
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
        direct_grants: bool = True,
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
        return cls(
            client,
            pubsub_ping_interval=pubsub_ping_interval,
            pubsub_linger=pubsub_linger,
            owns_client=True,
            direct_grants=direct_grants,
        )

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

    def acquire(self, name: str, token: str, ttl_ms: int, tag: int | None = None) -> Granted | HeldByOther:
        """Try to take ``name``. ``tag`` (the core's request id, passed by a ``LockClient``
        because this service ``grants_on_release``): a refused attempt queues this lease for a
        direct grant, announced on our wake channel with that tag (protocol 3)."""
        sub = self._sub
        # Queue our wake channel if ``name`` has waiters here and the channel is live (read
        # inline: the subscriber is this module's own).
        wake = sub.wake_channel if sub._wake_live and name in sub._waiting else None
        if wake is None or sub._grant_route.shared():
            tag = None  # nothing queued (the plain form), or a shared service: protocol 2
        if wake is not None and tag is None:
            self._queued.sent(name)
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_acquire
            reply = d.call(pack(w, token, ttl_ms, False, wake, tag), lambda: pack(w, token, ttl_ms, True, wake, tag))
        else:
            k = proto.keys_for(name)
            if wake is None:
                reply = self._run(self._acquire, [k.lock, k.fence], [token, proto.ttl_arg(ttl_ms)])
            elif tag is None:
                reply = self._run(self._acquire, [k.lock, k.fence, k.waiters], [token, proto.ttl_arg(ttl_ms), wake])
            else:
                reply = self._run(
                    self._acquire, [k.lock, k.fence, k.waiters, k.grants], [token, proto.ttl_arg(ttl_ms), wake, tag]
                )
        result = proto.parse_acquire(reply)
        if wake is not None and tag is None:
            self._queued.answered(name, isinstance(result, Granted))
        return result

    def send_acquire(
        self, name: str, token: str, ttl_ms: int, tag: int | None = None
    ) -> Callable[[], Granted | HeldByOther] | None:
        """Send ``acquire(name, token, ttl_ms, tag)`` now and return a callable that reads its
        reply and returns what ``acquire`` would (the optional capability ``LockClient`` uses on a
        handoff, see :mod:`leasehold.service`); ``None`` when nothing was sent: no packed fast
        path, no idle connection of our own (a connect does not belong on the thread that
        reads a wake-up), or the send failed — the caller then runs ``acquire`` as usual.

        The callable must be called exactly once, on any thread: until then the connection is
        checked out with a reply pending. If its read fails it retries under the connection's
        ``retry`` (re-sending: ACQUIRE is idempotent for a token), after NOSCRIPT it sends EVAL,
        as ``acquire`` does; an interrupted read disconnects the connection."""
        d = self._direct
        if d is None or self._closed:
            return None
        sub = self._sub
        wake = sub.wake_channel if sub._wake_live and name in sub._waiting else None
        if wake is None or sub._grant_route.shared():
            tag = None
        w = proto.wire_for(name)
        pack = proto.pack_acquire
        packed = pack(w, token, ttl_ms, False, wake, tag)
        track = wake is not None and tag is None
        if track:
            self._queued.sent(name)
        read = d.send(packed, lambda: pack(w, token, ttl_ms, True, wake, tag))
        if read is None:
            return None
        queued = self._queued

        def result() -> Granted | HeldByOther:
            r = proto.parse_acquire(read())
            if track:
                queued.answered(name, isinstance(r, Granted))
            return r

        return result

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes = b"") -> bool:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_renew
            return proto.parse_flag(d.call(pack(w, token, ttl_ms), lambda: pack(w, token, ttl_ms, True)), "RENEW")
        k = proto.keys_for(name)
        return proto.parse_flag(self._run(self._renew, [k.lock], [token, proto.ttl_arg(ttl_ms)]), "RENEW")

    def release(self, name: str, token: str, backend_data: bytes = b"") -> bool:
        """Release ``token``'s hold. The protocol-3 form: the oldest queued lease whose client
        is listening gets the lock at once (a grant notice), a protocol-2 entry a wake-up."""
        sub = self._sub
        skip = self._queued.stale_entry(name, name in sub._waiting, sub.wake_channel)
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_release
            g = self.grants_on_release
            return proto.parse_flag(
                d.call(pack(w, token, False, skip, g), lambda: pack(w, token, True, skip, g)), "RELEASE"
            )
        k = proto.keys_for(name)
        args = [token, k.channel, name] + ([skip] if skip is not None else [])
        keys = [k.lock, k.waiters, k.fence, k.grants] if self.grants_on_release else [k.lock, k.waiters]
        return proto.parse_flag(self._run(self._release, keys, args), "RELEASE")

    # ---- inspection (CLI `leasehold status`) -----------------------------------------------
    def ping(self) -> bool:
        """One PING: raises (``redis.ConnectionError`` ...) when the server is unreachable."""
        return bool(self._client.ping())

    def status(self, name: str) -> Any:
        """What Redis says about ``name`` right now (read-only, advisory; one MULTI/EXEC).

        Returns a :class:`leasehold.service.LockStatus` (the holder's pid, host and holding
        time are ``None``: the lock keys do not record them). Garbage in the keyspace raises
        :class:`ProtocolError` with an ``lh:`` message, as the scripts would.
        """
        from ..service import LockStatus

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

    # ---- waking waiters ---------------------------------------------------------------------
    def watch_waiter(self, name: str, on_wake: Callable[[str], object]) -> None:
        """The client has waiters for ``name``: queue our wake channel with its attempts and call
        ``on_wake(name)`` when a release picks us (if it returns ``False``, nobody took the
        wake-up and it is passed on), or ``on_wake(name, notice)`` when a release granted the
        lock to one of our tagged attempts (a :class:`~.redis_protocol.GrantNotice`; ``False``
        or an exception: nobody takes it, and the grant is released). Returns once the wake
        channel is subscribed (bounded by the socket timeout), so no release can pick us
        before we listen."""
        if self._closed:
            return
        self._sub.wait_on(name, on_wake)

    def unwatch_waiter(self, name: str) -> None:
        """No waiter for ``name`` here any more. A waiter that won stays queued until our
        RELEASE drops the entry (no extra command on the handoff path); one that gave up
        leaves the queue now (best effort)."""
        self._sub.stop_waiting(name)
        if self._queued.gave_up(name) and not self._closed:
            try:
                self._client.zrem(proto.keys_for(name).waiters, self._sub.wake_channel)
            except Exception as e:  # noqa: BLE001 - the release skips or passes it on anyway
                log.debug("leaving the waiters queue of %r failed: %s", name, e)

    def forget_queued(self, name: str, token: str) -> None:
        """Protocol 3: the lease ``token`` gave up waiting for ``name``; take its queue entry
        out (best effort; ``LockClient`` calls it on its watch thread). An entry left behind,
        or queued again by an attempt still in flight, is granted once and then released."""
        if self._closed:
            return
        k = proto.keys_for(name)
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(k.waiters, proto.lease_entry(self._sub.wake_channel, token))
            pipe.hdel(k.grants, token)
            pipe.execute()
        except Exception as e:  # noqa: BLE001 - left behind, it is granted once and released
            log.debug("leaving the waiters queue of %r failed: %s", name, e)

    def _pass_on(self, name: str) -> None:
        """(pub/sub thread) A release picked us for ``name`` but nobody here waits for it."""
        if self._closed:
            return
        try:
            self._run(self._notify, [proto.keys_for(name).waiters], [name, self._sub.wake_channel])
        except Exception as e:  # noqa: BLE001 - the waiters' retry timers still run
            log.debug("passing a wake-up for %r on failed: %s", name, e)

    def _release_stray(self, notice: proto.GrantNotice) -> None:
        """(the thread that read it) A grant notice nobody here takes (no waiter for the name
        any more, or the client closed): release that grant, which hands it to the next."""
        if self._closed:
            return  # the grant runs out by its TTL
        try:
            self.release(notice.name, notice.token)
        except Exception as e:  # noqa: BLE001 - the grant then runs out by its TTL
            log.debug("releasing a stray grant of %r failed: %s", notice.name, e)

    def park(self, ready: threading.Event, timeout: float) -> bool:
        """A waiting ``acquire()`` serves the pub/sub connection itself meanwhile, so its wake-up
        is read and its next attempt sent on this thread, with no hand-off (see the base)."""
        return self._sub.park(ready, timeout)

    def unpark(self) -> None:
        self._sub.unpark()

    def end_park(self) -> None:
        self._sub.end_park()

    @property
    def wake_channel(self) -> str:
        """This service's wake channel (diagnostics, tests)."""
        return self._sub.wake_channel

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
                return _send(conn, packed)
            except NoScriptError:
                # First use on this server (or after a restart / SCRIPT FLUSH): EVAL caches it.
                return _send(conn, packed_eval())
        finally:
            self._give_back(conn)

    def _give_back(self, conn: Any) -> None:
        if getattr(conn, "should_reconnect", _never)():  # a maintenance notification asked for it
            conn.disconnect()
        self._free.append(conn)
        if self._closed:
            self.close()

    def send(self, packed: bytes, packed_eval: Callable[[], bytes]) -> Callable[[], Any] | None:
        """Send ``packed`` (EVALSHA) on an idle connection now; returns a callable that reads
        the reply (after NOSCRIPT: sends ``packed_eval()`` and reads that) and gives the
        connection back, to be called exactly once. ``None`` when nothing was sent (no idle
        connection: no connect here; or the send failed, and the connection went back clean)."""
        if self._pid != os.getpid():
            self._free, self._pid = [], os.getpid()
        if self._closed:
            return None
        try:
            conn = self._free.pop()
        except IndexError:
            return None
        try:
            conn.send_packed_command((packed,), check_health=bool(conn.health_check_interval))
        except BaseException as e:
            conn.disconnect()  # (redis-py did too) nothing half-sent stays on it
            self._give_back(conn)
            if isinstance(e, Exception):
                return None
            raise
        pid = self._pid

        def read() -> Any:
            if os.getpid() != pid:
                # A forked child never reads (nor frees) the parent's socket: dropped here.
                raise redis.ConnectionError("the reply is pending in the parent process")
            done = False
            try:
                try:
                    reply = _read_sent(conn, packed)
                except NoScriptError:
                    reply = _send(conn, packed_eval())
                done = True
                return reply
            finally:
                if not done:
                    # An error, or an interrupt with the reply maybe still on its way: the
                    # connection never goes back with an unread reply.
                    conn.disconnect()
                self._give_back(conn)

        return read

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
    # No health check when none is configured (it would be a no-op call).
    conn.send_packed_command((packed,), check_health=bool(conn.health_check_interval))  # a sequence of buffers
    return conn.read_response()


def _send(conn: Any, packed: bytes) -> Any:
    """One exchange under the connection's ``retry``, as ``retry.call_with_retry(exchange,
    disconnect)`` runs it; the wrapper is entered only once a first attempt failed (and then
    handles that failure as its own first one), so a normal exchange costs no extra frames."""
    try:
        return _exchange(conn, packed)
    except Exception as e:
        return _retry_after(conn, packed, e)


def _read_sent(conn: Any, packed: bytes) -> Any:
    """The reply of ``packed``, already sent on ``conn``: as the second half of ``_send``
    (a failed read is that exchange's first failure; the retries re-send)."""
    try:
        return conn.read_response()
    except Exception as e:
        return _retry_after(conn, packed, e)


def _retry_after(conn: Any, packed: bytes, e: Exception) -> Any:
    first: list[Exception] = [e]

    def attempt() -> Any:
        if first:
            raise first.pop()
        return _exchange(conn, packed)

    return conn.retry.call_with_retry(attempt, lambda _e: conn.disconnect())


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


def _push_as_is(response: Any) -> Any:
    return response


def _pass_pushes_as_is(conn: Any) -> None:
    """RESP3 pub/sub pushes on ``conn`` pass through unchanged, as with redis-py's default
    handler, which also formats each message and offers it to a debug logger (a dozen calls on
    the path of every wake-up). Set on the connected parser (``PubSub(push_handler_func=)``
    would fail on a RESP2 parser, which has no push handler and needs none)."""
    setter = getattr(getattr(conn, "_parser", None), "set_pubsub_push_handler", None)
    if setter is not None:
        setter(_push_as_is)


def _ignore(_name: str) -> None:
    pass


def _close_pipe(pipe: tuple[int, int] | None) -> None:
    for fd in pipe or ():
        try:
            os.close(fd)
        except OSError:
            pass


_THREAD = "thread"  # the pub/sub thread serves its connection (see ``_Subscriber.park``)


class _Conn:
    """The state of one pub/sub connection, kept across turns of ``_Subscriber._step`` (by the
    thread, or by a parked waiter it lent the connection to)."""

    def __init__(self, ps: Any) -> None:
        self.ps = ps
        self.subscribed: set[str] = set()
        # Unwatched channels stay subscribed for a while: a waiter that stops and starts again
        # (the usual acquire/release loop) costs no UNSUBSCRIBE/SUBSCRIBE round trip.
        self.lingering: dict[str, float] = {}
        self.seen: dict[str, int] = {}  # watch generation last served per subscribed channel
        self.ping_pending = False
        self.last_traffic = time.monotonic()
        self.reconcile = True
        self.error: BaseException | None = None  # the connection failed under a waiter


class _Subscriber:
    """One pub/sub connection on its own daemon thread.

    The thread owns the redis-py ``PubSub`` object (which is not thread-safe); ``watch`` and
    ``unwatch`` only edit the wanted set and poke a self-pipe, and the thread reconciles the
    subscriptions (an unwatched channel stays subscribed for ``linger`` seconds, so a name that
    is watched, unwatched and watched again in a loop does not churn SUBSCRIBE/UNSUBSCRIBE). It
    waits with ``select`` on the pub/sub socket and the pipe, so a new watch is subscribed at
    once and an idle subscriber costs no CPU and one PING per ``ping_interval``.
    """

    def __init__(
        self,
        client: redis.Redis,
        ping_interval: float,
        linger: float = 10.0,
        on_stray: Callable[[str], None] | None = None,
        on_stray_grant: Callable[[proto.GrantNotice], None] | None = None,
    ) -> None:
        self._client = client
        self._ping_interval = ping_interval
        self._linger = linger
        self._lock = threading.Lock()
        self._live_changed = threading.Condition(self._lock)
        self._on_stray = on_stray
        self._on_stray_grant = on_stray_grant
        # The wake channel: subscribed from the first waiter on, for the life of the service.
        self.wake_channel = proto.new_wake_channel()
        self._wake_bytes = self.wake_channel.encode()
        self._waiting: dict[str, Callable[[str], object]] = {}
        # Where a grant notice goes when its name has no waiter here any more (see
        # _handle_grant): the one client that ever waited through this service.
        self._grant_route = proto.GrantRoute()
        self._wake_live = False  # the server confirmed the wake channel's subscription
        self._wanted: dict[str, tuple[str, Callable[[str], None]]] = {}
        self._gen: dict[str, int] = {}  # bumped by every watch() of a channel
        self._next_gen = 0
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._pid = os.getpid()
        self._closed = False
        self.reconnects = 0
        # Who serves the connection: the thread (``_THREAD``), or a parked waiter (its thread
        # ident) that claimed it (``park``), so that its wake-up needs no thread hand-off.
        self._lead: object = None
        self._claim: int | None = None
        self._conn: _Conn | None = None
        self._lead_changed = threading.Condition(self._lock)

    # -- called from any thread --
    def wait_on(self, name: str, on_wake: Callable[[str], object]) -> None:
        """Deliver wake-ups for ``name``; returns once the wake channel is live (or after the
        connection's socket timeout: attempts then do not queue, and waiters use their timers)."""
        with self._lock:
            if self._closed:
                return
            self._reset_after_fork_locked()
            self._waiting[name] = on_wake
            self._grant_route.saw(on_wake)
            if self.wake_channel not in self._wanted:
                # A fixed generation: a new waiting name needs no re-check of the others.
                self._wanted[self.wake_channel] = ("", _ignore)
                self._gen[self.wake_channel] = 0
            self._ensure_thread_locked()
            live = self._wake_live
        if not live:
            self._poke()
            kw = self._client.connection_pool.connection_kwargs
            limit = float(kw.get("socket_connect_timeout") or kw.get("socket_timeout") or 2.0) * 2
            with self._lock:
                self._live_changed.wait_for(lambda: self._wake_live or self._closed, timeout=limit)

    def stop_waiting(self, name: str) -> None:
        with self._lock:
            self._waiting.pop(name, None)

    def park(self, ready: threading.Event, timeout: float) -> bool:
        """Wait for ``ready`` (at most ``timeout`` s) while serving the connection on this
        thread, so that a wake-up for this thread's lease is read and handled here, and its
        attempt runs without a hand-off between threads. One waiter serves at a time (any other
        just waits on ``ready``); it keeps the connection between its parks, until ``end_park``,
        so the thread does not compete with it for the GIL during its attempt."""
        me = threading.get_ident()
        end = time.monotonic() + timeout
        poke = False
        with self._lock:
            if self._lead != me and self._claim != me:
                if self._claim is not None or self._closed or self._thread is None or self._pid != os.getpid():
                    serve = False
                else:
                    self._claim, serve, poke = me, True, True
            else:
                serve = True
        if not serve:
            return ready.wait(timeout)
        if poke:
            self._poke()  # the thread leaves its select and lends the connection (``_lend``)
        with self._lock:
            while self._lead != me and not self._closed and not ready.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lead_changed.wait(left)
            st = self._conn if self._lead == me else None
        if st is None:
            return ready.wait(max(0.0, end - time.monotonic()))
        try:
            while True:
                if ready.is_set():
                    return True  # without Event.wait's condition round
                left = end - time.monotonic()
                if left <= 0:
                    break
                if not self._step(st, left, ready.is_set):
                    self.end_park()  # closed, or no connection: the thread's to handle
                    break
        except BaseException as e:
            # The thread reconnects; an interrupt may have cut a reply in half, so it too
            # counts as a failed connection.
            st.error = e if isinstance(e, Exception) else redis.ConnectionError("interrupted while reading")
            self.end_park()
            if not isinstance(e, Exception):
                raise
        return ready.wait(max(0.0, end - time.monotonic()))

    def unpark(self) -> None:
        """A parked thread's ``ready`` was set by another thread: make a waiter that serves
        the connection (or waits for it) look."""
        claim = self._claim
        if claim is None or claim == threading.get_ident():
            return  # nobody parked in here, or the caller is the parked thread itself
        with self._lock:
            self._lead_changed.notify_all()
            lead = self._lead
        if lead not in (None, _THREAD):
            self._poke()

    def end_park(self) -> None:
        """(the parked thread) Done waiting: give the connection back to the thread."""
        me = threading.get_ident()
        if self._claim != me and self._lead != me:
            return
        with self._lock:
            if self._claim == me:
                self._claim = None
            if self._lead == me:
                self._lead = None
            self._lead_changed.notify_all()

    def watch(self, channel: str, name: str, cb: Callable[[str], None]) -> None:
        with self._lock:
            if self._closed:
                return
            self._reset_after_fork_locked()
            self._wanted[channel] = (name, cb)
            self._next_gen += 1
            self._gen[channel] = self._next_gen
            self._ensure_thread_locked()
        self._poke()

    def _ensure_thread_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            _close_pipe(self._pipe)  # left by a thread that ended (it never should)
            self._pipe = os.pipe()
            os.set_blocking(self._pipe[0], False)
            os.set_blocking(self._pipe[1], False)
            self._thread = threading.Thread(target=self._run, name="leasehold-redis-pubsub", daemon=True)
            self._thread.start()

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
            self._waiting.clear()
            self._live_changed.notify_all()
            self._lead_changed.notify_all()
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
            self._waiting.clear()
            self._grant_route = proto.GrantRoute()
            self._wake_live = False
            self._lead, self._claim = None, None
            self.wake_channel = proto.new_wake_channel()  # never share the parent's
            self._wake_bytes = self.wake_channel.encode()

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
                self._set_wake_live(False)
                try:
                    ps.reset()
                except Exception:  # pragma: no cover
                    pass
            self._wait(backoff)
            self._drain_pipe()
            backoff = min(backoff * 2, _RECONNECT_CAP)
            self.reconnects += 1

    def _set_wake_live(self, live: bool) -> list[tuple[str, Callable[[str], object]]]:
        """Record whether the wake channel is live; returns the waiters to re-check."""
        with self._lock:
            self._wake_live = live
            self._live_changed.notify_all()
            return list(self._waiting.items()) if live else []

    def _serve(self, ps: Any) -> None:
        # Until the server confirms the wake channel on this connection, attempts do not queue.
        self._set_wake_live(False)
        st = _Conn(ps)
        while True:
            self._lend(st)
            if st.error is not None:
                raise st.error  # the connection failed under a parked waiter
            if not self._step(st, None, self._claimed):
                return  # closed

    def _lend(self, st: _Conn) -> None:
        """(pub/sub thread) Hand the connection to a parked waiter that claimed it, and take it
        back once the waiter is done (see ``park``)."""
        with self._lock:
            if self._claim is None or self._closed or st.ps.connection is None:
                return
            self._conn = st
            self._lead = self._claim
            self._lead_changed.notify_all()
            # Not bounded by close(): the waiter sees it (a poke) and gives the connection back.
            while self._lead is not None:
                self._lead_changed.wait()
            self._lead = _THREAD
            self._conn = None
            st.reconcile = True

    def _claimed(self) -> bool:
        """(pub/sub thread) A parked waiter asked for the connection: go round to ``_lend``
        instead of waiting (its poke may have been drained by this very turn)."""
        return self._claim is not None

    def _step(self, st: _Conn, limit: float | None, done: Callable[[], bool] = _never) -> bool:
        """One turn of serving the connection: reconcile the subscriptions (after a poke or a
        timeout) or read what arrived, then wait for the socket or the pipe. ``limit`` caps the
        wait; ``done`` is asked before it. False once the subscriber is closed, or when a waiter
        cannot go on serving (no connection)."""
        ps = st.ps
        if st.reconcile:
            self._drain_pipe()
            with self._lock:
                if self._closed:
                    return False
                wanted = dict(self._wanted)
                gens = dict(self._gen)
            now = time.monotonic()
            plan = proto.reconcile(st.subscribed, wanted, gens, st.seen, st.lingering, now, self._linger)
            for target in plan.deliver:
                self._deliver(target)
            if plan.subscribe:
                ps.subscribe(*sorted(plan.subscribe))
                _pass_pushes_as_is(ps.connection)
                st.subscribed |= plan.subscribe
            expired = plan.expired
            if expired:
                if expired == st.subscribed:
                    # Nothing left to listen to: drop the connection (an unsubscribed
                    # pub/sub connection would need RESP handling we do not want) until
                    # the next watch.
                    ps.reset()
                    st.subscribed.clear()
                else:
                    ps.unsubscribe(*sorted(expired))
                    st.subscribed -= expired
            conn = ps.connection
            if conn is None:
                if limit is not None:
                    return False  # a waiter leaves this to the thread
                self._wait(self._ping_interval)
                return True
            # Deliver everything already buffered or readable without blocking.
            while True:
                msg = ps.get_message(timeout=0)
                if msg is None:
                    break
                st.last_traffic = time.monotonic()
                st.ping_pending = False
                self._handle(ps, msg)
        else:
            # Only the socket was readable: deliver what arrived, skip the bookkeeping
            # (the read uses the socket's own timeout: no settimeout round per message).
            conn = ps.connection
            wake = self._wake_bytes
            while True:
                reply = conn.read_response(disconnect_on_error=False, push_request=True)
                st.ping_pending = False
                if type(reply) is list and len(reply) == 3 and reply[0] == b"message" and reply[1] == wake:
                    # A wake-up (the handoff's critical path): straight to the waiter, which
                    # may be this thread (then it goes at once; the next turn reads the rest).
                    self._handle_wake(ps, "message", reply[2])
                    if done():
                        st.last_traffic = time.monotonic()
                        st.reconcile = True
                        return True
                else:
                    msg = ps.handle_message(reply)
                    if msg is not None:
                        self._handle(ps, msg)
                if not _buffered(conn):
                    break
            st.last_traffic = time.monotonic()
        if done():
            st.reconcile = True  # the next turn must not block in a read (nothing may be there)
            return True
        sock = getattr(conn, "_sock", None)
        if sock is None:
            raise redis.ConnectionError("pub/sub connection lost")
        now = time.monotonic()
        idle = now - st.last_traffic
        if idle >= self._ping_interval:
            if st.ping_pending:
                raise redis.TimeoutError(f"no answer to PING within {self._ping_interval:.1f}s")
            ps.ping()
            st.ping_pending = True
            st.last_traffic = now
            st.reconcile = True
            return True
        timeout = self._ping_interval - idle
        if st.lingering:
            timeout = min(timeout, max(0.0, min(st.lingering.values()) - now))
        if limit is not None:
            timeout = min(timeout, limit)
        sock_ready, pipe_ready = self._wait(timeout, sock)
        # A message alone takes the short path above (the bulk of the traffic); a poke, a
        # timeout (ping, linger) or both at once run the full loop.
        st.reconcile = pipe_ready or not sock_ready
        return True

    def _handle(self, ps: Any, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if channel == self.wake_channel:
            self._handle_wake(ps, kind, msg.get("data"))
        elif kind == "message":
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

    def _handle_wake(self, ps: Any, kind: Any, data: Any) -> None:
        if kind == "message":
            if isinstance(data, str):
                data = data.encode("utf-8", "surrogateescape")
            if data[:1] == b"\0":
                self._handle_grant(data)
                return
            name = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            with self._lock:
                cb = self._waiting.get(name)
            if not proto.offer_wake(cb, name) and self._on_stray is not None:
                self._on_stray(name)
        elif kind == "subscribe":
            ps._lh_confirmed = True
            # Releases while we were not listening popped our entry without reaching us: every
            # waiter re-checks once now.
            for entry in self._set_wake_live(True):
                self._deliver(entry)

    def _handle_grant(self, data: bytes) -> None:
        """A release granted the lock to one of our queued leases: the notice goes to the
        client, whose core decides (it may hold that lease already: its own ACQUIRE can win
        the race with the notice, and the client then no longer waits for the name). A
        notice no client takes is released (else it would block the name until its TTL ran
        out). On a service two clients share, every client gets it, marked ``shared``, and
        nobody releases it (see ``GrantRoute``)."""
        notice = proto.parse_grant_notice(data)
        if notice is None:
            log.warning("leasehold: ignoring a malformed grant notice on %s: %r", self.wake_channel, data[:80])
            return
        with self._lock:
            clients = list(self._grant_route.clients)
        taken = proto.offer_notice(clients, notice)
        if not taken and len(clients) <= 1 and self._on_stray_grant is not None:
            self._on_stray_grant(notice)

    @staticmethod
    def _deliver(entry: tuple[str, Callable[[str], object]]) -> None:
        name, cb = entry
        try:
            cb(name)
        except Exception:  # pragma: no cover - a callback bug must not kill the subscriber
            log.exception("leasehold redis on_released callback failed for %r", name)

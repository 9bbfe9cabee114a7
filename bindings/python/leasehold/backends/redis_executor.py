"""The Redis executor: runs the core's Redis requests with redis-py, verbatim.

The core speaks the Redis protocol itself (keys, scripts, arguments, replies, the wait queue
and the wake channel: ``docs/redis-protocol.md``). This module only owns two connections —
commands (from a redis-py connection pool) and one subscriber — runs each request's argument
vector on the connection it names, and hands back raw replies, pub/sub messages and
subscribe/unsubscribe confirmations. A broken subscriber is reported as every subscription
gone; the core then asks to subscribe again.

Redis Sentinel: :meth:`RedisExecutor.from_sentinel` (or a ``master_for`` client given as
``client``) makes every connection, the subscriber's too, ask the sentinels for the master
when it (re)connects, so both follow a failover. Connection pools, URLs and Sentinel
discovery: :mod:`leasehold.backends.redis_connect`.
"""

from __future__ import annotations

import inspect
import threading
from functools import partial
from typing import Any, Iterable, Protocol

import redis
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from .._backend import Deferred
from .._core import RedisOptions
from .redis_connect import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    SENTINEL_SCHEME,
    connection_pool,
    parse_sentinel_url,
    parse_sentinels,
    sentinel_pool,
)

# The connection helpers live in redis_connect; they stay importable from here.
__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "SENTINEL_SCHEME",
    "RedisExecutor",
    "Sink",
    "connection_pool",
    "error_value",
    "parse_sentinel_url",
    "parse_sentinels",
    "sentinel_pool",
]

# redis-py strips a known error code off the message and picks an exception class by it;
# the core reads the reply as the server sent it, so the code goes back in front.
_ERROR_CODES = {cls: code for code, cls in BaseParser.EXCEPTION_CLASSES.items() if isinstance(cls, type)}


def error_value(e: ResponseError) -> ResponseError:
    """An error reply as the server sent it (redis-py's stripped error code restored)."""
    code = _ERROR_CODES.get(type(e))
    return ResponseError(f"{code} {e}") if code else e


class Sink(Protocol):
    """Where the subscriber connection's traffic goes (the client feeds it to the core)."""

    def message(self, channel: bytes, payload: bytes) -> None: ...

    def subscription(self, channel: bytes, subscribed: bool) -> None: ...


def _address(conn: Any) -> tuple[Any, Any]:
    return getattr(conn, "host", None), getattr(conn, "port", None)


class RedisExecutor:
    """Runs a Redis-protocol core's requests on a redis-py connection pool (thread-safe);
    give it to ``LockClient`` in place of a service. One client at a time.

    :param client: a ``redis.Redis`` or ``redis.ConnectionPool`` (its options — password,
        ACL user, db, unix socket, TLS — are used as they are); or ``None`` with ``url`` or
        redis-py connection keywords
    :param options: the core's Redis protocol options (standby delay, key keep time...)
    :param owns_pool: ``close()`` also disconnects the pool (default: when it was made here)
    """

    def __init__(
        self,
        client: redis.Redis | redis.ConnectionPool | None = None,
        *,
        url: str | None = None,
        options: RedisOptions | None = None,
        owns_pool: bool | None = None,
        **redis_kwargs: Any,
    ) -> None:
        self.pool = connection_pool(client, url, **redis_kwargs)
        self.options = options or RedisOptions()
        self._owns_pool = client is None if owns_pool is None else owns_pool
        # redis-py 5 wants a command name here (unused), later versions none.
        param = inspect.signature(self.pool.get_connection).parameters.get("command_name")
        self._named = param is not None and param.default is inspect.Parameter.empty
        self._mu = threading.Lock()
        self._sub: Any = None  # the subscriber connection while open
        self._channels: set[bytes] = set()  # subscribed (or asked), reported gone on loss
        self._attached = False
        self._idle: list[Any] = []  # command connections between calls (list ops are atomic)

    backend_protocol = "redis"
    notifications = True

    @classmethod
    def from_sentinel(
        cls,
        sentinels: str | Iterable[str | tuple[str, int]],
        master_name: str,
        *,
        options: RedisOptions | None = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        **redis_kwargs: Any,
    ) -> RedisExecutor:
        """An executor on the master of a Redis Sentinel deployment (see :func:`sentinel_pool`);
        ``close()`` closes its connections and the sentinels'.

        Replication is asynchronous: a failover can lose a held lease's key. Its next renew
        finds it gone and the lease ends lost (its loss signal fires); fences never go back
        while the servers' clocks are sane (``docs/backends.md``)."""
        pool = sentinel_pool(sentinels, master_name, sentinel_kwargs=sentinel_kwargs, **redis_kwargs)
        return cls(pool, options=options, owns_pool=True)

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        with self._mu:
            if self._attached:
                raise ValueError("this RedisExecutor already serves a client; make one per client")
            self._attached = True

    def detach(self) -> None:
        """The client stopped: the subscriber connection closes (the pool stays usable)."""
        with self._mu:
            self._attached = False
            conn, self._sub, self._channels = self._sub, None, set()
            idle, self._idle = self._idle, []
        if conn is not None:
            conn.disconnect()
        for c in idle:
            self.pool.release(c)

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's connections without touching their
        sockets; the child opens its own."""
        self._mu = threading.Lock()
        self._sub, self._channels, self._idle = None, set(), []
        self._attached = False  # the child's client attaches anew

    # -- commands ----------------------------------------------------------------------------
    def command(self, argv: list[bytes]) -> Any:
        """Run ``argv`` on a pooled connection; the raw reply (an error reply is returned as
        a ``ResponseError``). Raises on a transport failure."""
        conn = self._checkout()
        try:
            conn.send_command(*argv, check_health=False)
        except BaseException:
            self._drop(conn)
            raise
        return self._reply(conn)

    def command_within(self, argv: list[bytes], timeout: float) -> Any:
        """:meth:`command`, waiting for the reply at most ``timeout`` seconds (an
        application's deadline); past it raises :class:`~leasehold._backend.Deferred`, whose
        ``finish()`` reads the reply (within the socket timeout) on another thread."""
        conn = self._checkout()
        try:
            conn.send_command(*argv, check_health=False)
            # can_read buffers what arrived and keeps the connection as it was on a timeout.
            ready = conn.can_read(timeout=max(timeout, 0.001))
        except BaseException:
            self._drop(conn)
            raise
        if not ready:
            raise Deferred(partial(self._reply, conn))
        return self._reply(conn)

    def _checkout(self) -> Any:
        try:
            return self._idle.pop()  # kept out of the pool: no checks per call
        except IndexError:
            pass
        conn = self.pool.get_connection("_") if self._named else self.pool.get_connection()
        sub = self._sub
        if sub is not None and getattr(sub, "_sock", None) is not None and _address(sub) != _address(conn):
            # (Sentinel) the master moved: the subscriber breaks, and is reported lost, so
            # the core subscribes again on the new master.
            sub.disconnect()
        return conn

    def _reply(self, conn: Any) -> Any:
        try:
            reply = conn.read_response()
        except ResponseError as e:
            reply = error_value(e)
        except BaseException:
            self._drop(conn)
            raise
        self._idle.append(conn)
        return reply

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self.pool.release(conn)

    # -- the subscriber ------------------------------------------------------------------------
    def subscriber(self, argv: list[bytes], sink: Sink) -> None:
        """Send ``argv`` (SUBSCRIBE / UNSUBSCRIBE) on the subscriber connection, opening it
        (and its reader thread) first if needed; confirmations and messages go to ``sink``."""
        with self._mu:
            if argv[0].upper() == b"SUBSCRIBE":
                self._channels.update(argv[1:])
            conn = self._sub
            if conn is None:
                # Outside the pool's count: it lives as long as its socket does.
                # RESP2: messages arrive as plain replies (RESP3 would route them to a push handler).
                kwargs = {k: v for k, v in self.pool.connection_kwargs.items() if not k.startswith("maint_")}
                kwargs.update(protocol=2, socket_timeout=None, socket_keepalive=True)
                conn = self._sub = self.pool.connection_class(**kwargs)
                fresh = True
            else:
                fresh = False
        try:
            if fresh:
                conn.connect()
                threading.Thread(target=self._read, args=(conn, sink), name="leasehold-redis-sub", daemon=True).start()
            conn.send_command(*argv, check_health=False)
        except BaseException:
            self._lost(conn, sink)
            raise

    def _read(self, conn: Any, sink: Sink) -> None:
        try:
            while True:
                msg = conn.read_response(disconnect_on_error=False)
                if isinstance(msg, list) and len(msg) == 3 and isinstance(msg[0], bytes):
                    kind = msg[0].lower()
                    if kind == b"message":
                        sink.message(msg[1], msg[2])
                    elif kind in (b"subscribe", b"unsubscribe"):
                        if kind == b"unsubscribe":
                            with self._mu:
                                self._channels.discard(msg[1])
                        sink.subscription(msg[1], kind == b"subscribe")
        except Exception:
            self._lost(conn, sink)

    def _lost(self, conn: Any, sink: Sink) -> None:
        """The subscriber connection broke: every subscription on it is gone."""
        with self._mu:
            if self._sub is not conn:
                return
            self._sub = None
            gone, self._channels = self._channels, set()
        conn.disconnect()
        for ch in gone:
            sink.subscription(ch, False)

    def close(self) -> None:
        """Close the subscriber connection, and the pool when owned."""
        self.detach()
        if self._owns_pool:
            self.pool.disconnect()
            for sentinel in getattr(getattr(self.pool, "sentinel_manager", None), "sentinels", ()):
                sentinel.close()

"""The Redis executor: runs the core's Redis requests with redis-py, verbatim.

The core speaks the Redis protocol itself (keys, scripts, arguments, replies, the wait queue
and the wake channel: ``docs/redis-protocol.md``). This module only owns two connections —
commands (from a redis-py connection pool) and one subscriber — runs each request's argument
vector on the connection it names, and hands back raw replies, pub/sub messages and
subscribe/unsubscribe confirmations. A broken subscriber is reported as every subscription
gone; the core then asks to subscribe again.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Protocol

import redis
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from .._core import RedisOptions

__all__ = ["RedisExecutor", "Sink", "connection_pool", "error_value"]

DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

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


def connection_pool(
    client: redis.Redis | redis.ConnectionPool | None = None, url: str | None = None, **kwargs: Any
) -> redis.ConnectionPool:
    """A connection pool from a redis-py client or pool, a URL (``redis://``, ``rediss://``,
    ``unix://``), or redis-py connection keywords (``host``, ``port``, ``db``, ``username``,
    ``password``, ``unix_socket_path``, ``ssl``...). Replies stay bytes either way."""
    if client is not None and url is not None:
        raise ValueError("give a redis-py client/pool or a URL, not both")
    if isinstance(client, redis.Redis):
        return client.connection_pool
    if isinstance(client, redis.ConnectionPool):
        return client
    if client is not None:
        raise TypeError(f"client must be a redis.Redis or redis.ConnectionPool, not {type(client).__name__}")
    kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    if url is not None:
        return redis.ConnectionPool.from_url(url, **kwargs)
    if kwargs.pop("ssl", False):
        kwargs["connection_class"] = redis.SSLConnection
    if "unix_socket_path" in kwargs:
        kwargs["connection_class"] = redis.UnixDomainSocketConnection
        kwargs["path"] = kwargs.pop("unix_socket_path")
    return redis.ConnectionPool(**kwargs)


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

    def attach(self) -> None:
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

    # -- commands ----------------------------------------------------------------------------
    def command(self, argv: list[bytes]) -> Any:
        """Run ``argv`` on a pooled connection; the raw reply (an error reply is returned as
        a ``ResponseError``). Raises on a transport failure."""
        try:
            conn = self._idle.pop()  # kept out of the pool: no checks per call
        except IndexError:
            conn = self.pool.get_connection("_") if self._named else self.pool.get_connection()
        try:
            conn.send_command(*argv, check_health=False)
            reply = conn.read_response()
        except ResponseError as e:
            reply = error_value(e)
        except BaseException:
            conn.disconnect()
            self.pool.release(conn)
            raise
        self._idle.append(conn)
        return reply

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

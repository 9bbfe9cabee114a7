"""The Redis Cluster executor: runs the core's Redis requests on a redis-py ``RedisCluster``.

The core speaks the protocol (``docs/redis-protocol.md``) with ``RedisOptions.sharded_wake``
on: every key of a name shares the hash tag ``{NAME}`` and the wake-ups of a name travel on
its shard channel (SPUBLISH from the scripts, Redis 7+). This module only
runs each command on the cluster client (which routes it by its keys' slot and follows
MOVED/ASK and failovers) and each ``SSUBSCRIBE`` / ``SUNSUBSCRIBE`` on a subscriber
connection to the master serving the channel's slot (one connection per node, each with its
reader thread). A subscriber connection that breaks — its node died, the slot moved — is
reported as each of its channels gone; the core subscribes them again, and they are routed
on a refreshed slot map.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterable

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from .._core import RedisOptions
from .._urls import check_url, redact
from .redis_connect import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    parse_addresses,
    split_credentials,
    tls_defaults,
)
from .redis_executor import Sink, error_value

__all__ = ["CLUSTER_SCHEME", "RedisClusterExecutor", "cluster_startup", "parse_cluster_url"]

CLUSTER_SCHEME = "redis+cluster"


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`` as (startup nodes,
    redis-py keywords: ``username``, ``password``). The port defaults to 6379."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != CLUSTER_SCHEME:
        raise ValueError(f"not a {CLUSTER_SCHEME}:// URL: {redact(url)}")
    check_url(url)  # a password with an unescaped '/' would otherwise be read as a path
    hosts, _, path = rest.partition("/")
    if path.strip("/"):
        raise ValueError(f"a {CLUSTER_SCHEME} URL has no path (Cluster has one database): {redact(url)}")
    hosts, kwargs = split_credentials(hosts)
    return _parse_nodes(hosts), kwargs


def _parse_nodes(nodes: str | Iterable[str | tuple[str, int]]) -> list[tuple[str, int]]:
    return parse_addresses(nodes, 6379, "cluster node")


def cluster_startup(
    nodes: str | Iterable[str | tuple[str, int]] | None,
    client: Any,
    url: str | None,
    redis_kwargs: dict[str, Any],
    retry: Any,
) -> list[tuple[str, int]]:
    """(both cluster executors) Checks that exactly one of ``nodes``, ``client`` and ``url``
    is given; without a client, the startup nodes, and ``redis_kwargs`` completed in place
    (the URL's credentials, the executors' timeouts, and ``retry``: the core retries on its
    own schedule, so redis-py only follows redirections, refreshes its slot map and tries a
    failed command once more)."""
    if sum(x is not None for x in (nodes, client, url)) != 1:
        raise ValueError("give exactly one of nodes, client or url")
    if client is not None:
        return []
    if url is not None:
        startup, from_url = parse_cluster_url(url)
        for k, v in from_url.items():
            redis_kwargs.setdefault(k, v)
    else:
        startup = _parse_nodes(nodes)  # type: ignore[arg-type]
    redis_kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    redis_kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    redis_kwargs.setdefault("retry", retry)
    if redis_kwargs.get("ssl"):
        tls_defaults(redis_kwargs)
    return startup


class RedisClusterExecutor:
    """Runs a Redis-protocol core's requests on a Redis Cluster (thread-safe); give it to
    ``LockClient`` in place of a service. One client at a time.

    :param nodes: startup nodes (``"h1:7000,h2:7001"`` or ``(host, port)`` pairs); or give
        ``client`` (a ``redis.cluster.RedisCluster`` with bytes replies) or ``url``
        (``redis+cluster://...``)
    :param options: the core's Redis protocol options; ``sharded_wake`` is always on here
    :param redis_kwargs: redis-py connection keywords (``password``, ``ssl``,
        ``socket_timeout``...)

    Replication is asynchronous per shard: a failover can lose a held lease's key. Its next
    renew finds it gone and the lease ends lost (its loss signal fires); fences never go
    back while the servers' clocks are sane (``docs/backends.md``).
    """

    backend_protocol = "redis"
    notifications = True

    def __init__(
        self,
        nodes: str | Iterable[str | tuple[str, int]] | None = None,
        *,
        client: redis.cluster.RedisCluster | None = None,
        url: str | None = None,
        options: RedisOptions | None = None,
        **redis_kwargs: Any,
    ) -> None:
        startup = cluster_startup(nodes, client, url, redis_kwargs, Retry(NoBackoff(), 1))
        if client is None:
            client = redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in startup],  # type: ignore[no-untyped-call]
                **redis_kwargs,
            )
            self._owns = True
        else:
            self._owns = False
        self.cluster = client
        base = options or RedisOptions()
        self.options = dataclasses.replace(base, sharded_wake=True)
        self._mu = threading.Lock()
        self._subs: dict[tuple[str, int], Any] = {}  # node address -> subscriber connection
        self._where: dict[bytes, tuple[str, int]] = {}  # channel -> node it was sent to
        self._stale = False  # a subscriber broke: refresh the slot map before routing again
        self._attached = False

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        with self._mu:
            if self._attached:
                raise ValueError("this RedisClusterExecutor already serves a client; make one per client")
            self._attached = True

    def detach(self) -> None:
        """The client stopped: the subscriber connections close (the cluster client stays)."""
        with self._mu:
            self._attached = False
            subs, self._subs, self._where = list(self._subs.values()), {}, {}
        for conn in subs:
            conn.disconnect()

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's subscriber connections without touching
        their sockets."""
        self._mu = threading.Lock()
        self._subs, self._where = {}, {}
        self._attached = False  # the child's client attaches anew

    # -- commands ----------------------------------------------------------------------------
    def command(self, argv: list[bytes]) -> Any:
        """Run ``argv`` on the node serving its keys' slot; the raw reply (an error reply is
        returned as a ``ResponseError``). Raises on a transport failure."""
        try:
            # redis-py routes by the command's name as text (its key positions, EVAL's numkeys).
            return self.cluster.execute_command(argv[0].decode("ascii"), *argv[1:])  # type: ignore[no-untyped-call]
        except ResponseError as e:
            return error_value(e)

    # -- the subscribers -----------------------------------------------------------------------
    def subscriber(self, argv: list[bytes], sink: Sink) -> None:
        """Send ``argv`` (SSUBSCRIBE / SUNSUBSCRIBE of one shard channel) on a subscriber
        connection to the master of the channel's slot; confirmations and messages go to
        ``sink``."""
        if len(argv) != 2:
            raise ValueError(f"one shard channel per request, got {len(argv) - 1}")
        verb, channel = argv[0].upper(), argv[1]
        if verb == b"SUNSUBSCRIBE":
            with self._mu:
                where = self._where.pop(channel, None)
                conn: Any = self._subs.get(where) if where else None
            if conn is not None:
                try:
                    conn.send_command(*argv, check_health=False)
                except BaseException:
                    self._lost(where, conn, sink)  # type: ignore[arg-type]
            return
        if verb != b"SSUBSCRIBE":
            raise ValueError(f"the cluster subscriber runs SSUBSCRIBE / SUNSUBSCRIBE, not {argv[0]!r}")
        if self._stale:
            self._stale = False
            self.cluster.nodes_manager.initialize()
        node = self.cluster.nodes_manager.get_node_from_slot(self.cluster.keyslot(channel))  # type: ignore[no-untyped-call]
        addr = (node.host, int(node.port))
        with self._mu:
            old = self._where.get(channel)
            self._where[channel] = addr
            conn = self._subs.get(addr)
            fresh = conn is None
            if fresh:
                kwargs = dict(node.redis_connection.connection_pool.connection_kwargs)
                kwargs = {k: v for k, v in kwargs.items() if not k.startswith("maint_")}
                # RESP2: messages arrive as plain replies.
                kwargs.update(protocol=2, socket_timeout=None, socket_keepalive=True)
                conn = self._subs[addr] = node.redis_connection.connection_pool.connection_class(**kwargs)
            stale_conn = self._subs.get(old) if old is not None and old != addr else None
        if stale_conn is not None:
            # The slot moved: the old node's subscription goes.
            try:
                stale_conn.send_command(b"SUNSUBSCRIBE", channel, check_health=False)
            except BaseException:
                self._lost(old, stale_conn, sink)  # type: ignore[arg-type]
        try:
            if fresh:
                conn.connect()
                threading.Thread(
                    target=self._read, args=(addr, conn, sink), name="leasehold-redis-ssub", daemon=True
                ).start()
            conn.send_command(*argv, check_health=False)
        except BaseException:
            # This request fails (the core retries it with backoff); the other channels on
            # the connection, if any, are lost with it.
            self._stale = True
            with self._mu:
                if self._where.get(channel) == addr:
                    del self._where[channel]
            self._lost(addr, conn, sink)
            raise

    def _read(self, addr: tuple[str, int], conn: Any, sink: Sink) -> None:
        try:
            while True:
                msg = conn.read_response(disconnect_on_error=False)
                if isinstance(msg, list) and len(msg) == 3 and isinstance(msg[0], bytes):
                    kind = msg[0].lower()
                    if kind == b"smessage":
                        sink.message(msg[1], msg[2])
                    elif kind == b"ssubscribe":
                        sink.subscription(msg[1], True)
                    elif kind == b"sunsubscribe":
                        # Asked for, or the slot left this node (then the core subscribes
                        # again, routed anew).
                        with self._mu:
                            if self._where.get(msg[1]) == addr:
                                del self._where[msg[1]]
                                self._stale = True
                        sink.subscription(msg[1], False)
        except Exception:
            # An error reply (MOVED: the slot map is out of date) or a broken connection.
            self._stale = True
            self._lost(addr, conn, sink)

    def _holds(self, addr: Any, conn: Any) -> bool:
        """Whether ``conn`` is still the subscriber connection to ``addr`` (not a replaced one)."""
        return self._subs.get(addr) is conn

    def _lost(self, addr: tuple[str, int], conn: Any, sink: Sink) -> None:
        """A subscriber connection broke: every channel on it is gone."""
        with self._mu:
            if not self._holds(addr, conn):
                return
            del self._subs[addr]
            gone = [ch for ch, a in self._where.items() if a == addr]
            for ch in gone:
                del self._where[ch]
        conn.disconnect()
        for ch in gone:
            sink.subscription(ch, False)

    def close(self) -> None:
        """Close the subscriber connections, and the cluster client when made here."""
        self.detach()
        if self._owns:
            self.cluster.close()

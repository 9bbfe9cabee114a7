"""The asyncio Redis Cluster executor (``redis.asyncio.cluster``) for ``AsyncLockClient``.

The twin of :mod:`leasehold.backends.redis_cluster_executor`: each command runs on the
cluster client (routed by its keys' slot, following MOVED/ASK and failovers), each
``SSUBSCRIBE`` / ``SUNSUBSCRIBE`` on a subscriber connection to the master serving the
channel's slot (one connection per node, each with its reader task). A subscriber connection
that breaks is reported as each of its channels gone; the core subscribes them again, routed
on a refreshed slot map. It knows nothing of the protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Iterable

import redis.asyncio.cluster as acluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from .._core import RedisOptions
from .redis_cluster_executor import cluster_startup
from .redis_executor import Sink, error_value

__all__ = ["AsyncRedisClusterExecutor"]

Address = tuple[str, int]


class AsyncRedisClusterExecutor:
    """Runs a Redis-protocol core's requests on a Redis Cluster with ``redis.asyncio`` (on one
    event loop); give it to ``AsyncLockClient`` in place of a service. One client at a time.

    Parameters as for :class:`~leasehold.backends.redis_cluster_executor.RedisClusterExecutor`,
    with a ``redis.asyncio.cluster.RedisCluster`` (bytes replies) as ``client``.
    """

    backend_protocol = "redis"
    notifications = True

    def __init__(
        self,
        nodes: str | Iterable[str | tuple[str, int]] | None = None,
        *,
        client: acluster.RedisCluster | None = None,
        url: str | None = None,
        options: RedisOptions | None = None,
        **redis_kwargs: Any,
    ) -> None:
        startup = cluster_startup(nodes, client, url, redis_kwargs, Retry(NoBackoff(), 1))
        if client is None:
            client = acluster.RedisCluster(
                startup_nodes=[acluster.ClusterNode(h, p) for h, p in startup], **redis_kwargs
            )
            self._owns = True
        else:
            self._owns = False
        self.cluster = client
        self.options = dataclasses.replace(options or RedisOptions(), sharded_wake=True)
        self._subs: dict[Address, Any] = {}  # node address -> subscriber connection
        self._readers: dict[Address, asyncio.Task[None]] = {}
        self._where: dict[bytes, Address] = {}  # channel -> node it was sent to
        self._stale = False  # a subscriber broke: refresh the slot map before routing again
        self._attached = False

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        if self._attached:
            raise ValueError("this AsyncRedisClusterExecutor already serves a client; make one per client")
        self._attached = True

    async def detach(self) -> None:
        """The client stopped: the subscriber connections close (the cluster client stays)."""
        self._attached = False
        subs, self._subs, self._where = list(self._subs.values()), {}, {}
        readers, self._readers = list(self._readers.values()), {}
        for task in readers:
            task.cancel()
        for conn in subs:
            await conn.disconnect()

    async def command(self, argv: list[bytes]) -> Any:
        """Run ``argv`` on the node serving its keys' slot; the raw reply (an error reply is
        returned as a ``ResponseError``). Raises on a transport failure."""
        try:
            return await self.cluster.execute_command(argv[0].decode("ascii"), *argv[1:])
        except ResponseError as e:
            return error_value(e)

    async def subscriber(self, argv: list[bytes], sink: Sink) -> None:
        """Send ``argv`` (SSUBSCRIBE / SUNSUBSCRIBE of one shard channel) on a subscriber
        connection to the master of the channel's slot; confirmations and messages go to
        ``sink``."""
        if len(argv) != 2:
            raise ValueError(f"one shard channel per request, got {len(argv) - 1}")
        verb, channel = argv[0].upper(), argv[1]
        if verb == b"SUNSUBSCRIBE":
            where = self._where.pop(channel, None)
            conn: Any = self._subs.get(where) if where else None
            if conn is not None:
                try:
                    await conn.send_command(*argv, check_health=False)
                except BaseException:
                    await self._lost(where, conn, sink)  # type: ignore[arg-type]
            return
        if verb != b"SSUBSCRIBE":
            raise ValueError(f"the cluster subscriber runs SSUBSCRIBE / SUNSUBSCRIBE, not {argv[0]!r}")
        await self.cluster.initialize()  # once: the first slot map
        if self._stale:
            self._stale = False
            await self.cluster.nodes_manager.initialize()
        node = self.cluster.nodes_manager.get_node_from_slot(self.cluster.keyslot(channel))
        addr = (node.host, int(node.port))
        old = self._where.get(channel)
        self._where[channel] = addr
        conn = self._subs.get(addr)
        fresh = conn is None
        if fresh:
            kwargs = {k: v for k, v in node.connection_kwargs.items() if not k.startswith("maint_")}
            # RESP2 (messages as plain replies), no read timeout: it waits for messages.
            kwargs.update(protocol=2, socket_timeout=None, socket_keepalive=True)
            conn = self._subs[addr] = node.connection_class(**kwargs)
        stale_conn = self._subs.get(old) if old is not None and old != addr else None
        if stale_conn is not None:
            # The slot moved: the old node's subscription goes.
            try:
                await stale_conn.send_command(b"SUNSUBSCRIBE", channel, check_health=False)
            except BaseException:
                await self._lost(old, stale_conn, sink)  # type: ignore[arg-type]
        try:
            if fresh:
                await conn.connect()
                self._readers[addr] = asyncio.get_running_loop().create_task(self._read(addr, conn, sink))
            await conn.send_command(*argv, check_health=False)
        except BaseException:
            # This request fails (the core retries it with backoff); the other channels on
            # the connection, if any, are lost with it.
            self._stale = True
            if self._where.get(channel) == addr:
                del self._where[channel]
            await self._lost(addr, conn, sink)
            raise

    async def _read(self, addr: Address, conn: Any, sink: Sink) -> None:
        try:
            while True:
                msg = await conn.read_response(disconnect_on_error=False)
                if isinstance(msg, list) and len(msg) == 3 and isinstance(msg[0], bytes):
                    kind = msg[0].lower()
                    if kind == b"smessage":
                        sink.message(msg[1], msg[2])
                    elif kind == b"ssubscribe":
                        sink.subscription(msg[1], True)
                    elif kind == b"sunsubscribe":
                        # Asked for, or the slot left this node (then the core subscribes
                        # again, routed anew).
                        if self._where.get(msg[1]) == addr:
                            del self._where[msg[1]]
                            self._stale = True
                        sink.subscription(msg[1], False)
        except Exception:
            # An error reply (MOVED: the slot map is out of date) or a broken connection.
            self._stale = True
            await self._lost(addr, conn, sink)

    def _holds(self, addr: Any, conn: Any) -> bool:
        """Whether ``conn`` is still the subscriber connection to ``addr`` (not a replaced one)."""
        return self._subs.get(addr) is conn

    async def _lost(self, addr: Address, conn: Any, sink: Sink) -> None:
        """A subscriber connection broke: every channel on it is gone."""
        if not self._holds(addr, conn):
            return
        del self._subs[addr]
        reader = self._readers.pop(addr, None)
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        gone = [ch for ch, a in self._where.items() if a == addr]
        for ch in gone:
            del self._where[ch]
        await conn.disconnect()
        for ch in gone:
            sink.subscription(ch, False)

    async def close(self) -> None:
        """Close the subscriber connections, and the cluster client when made here."""
        await self.detach()
        if self._owns:
            await self.cluster.aclose()
